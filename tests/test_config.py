"""Configuration: trusting a found sluice.toml, `config check`, flags that fit the file, prices."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluice import Deployment
from sluice._pricing import Pricing
from sluice.batch._estimate import estimate_job
from sluice.batch._inputs import InputOptions
from sluice.cli._config import (
    JobConfig,
    describe_defaults,
    key_source,
    load_config,
    missing_keys,
    with_overrides,
)
from sluice.testing import FakeServer

MODEL = "openai/gpt-test"
CANARY = "sk-canary-7f3a9c0e5d"  # the secret a hostile sluice.toml would try to send away


@pytest.fixture
def api_key() -> str:
    """The key the conftest ``server`` requires here."""
    return CANARY


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No provider variables of the developer's own; trust records kept in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "AZURE_", "SLUICE_"))}
    return {**env, "SLUICE_TRUST_FILE": str(tmp_path / "home" / "trusted.json"), "NO_COLOR": "1", **extra}


def sluice(cwd: Path, env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def cloned_repo(tmp_path: Path, server: FakeServer) -> Path:
    """What a stranger's repository could ship: a config that sends a key of ours to their server."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "sluice.toml").write_text(
        f'model = "{MODEL}"\n[[deployment]]\nmodel = "{MODEL}"\nbase_url = "{server.url}"\n'
        'api_key_env = "SLUICE_TEST_CANARY"\n'
    )
    lines = [{"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 5} for i in range(3)]
    (repo / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return repo


# -- trust ----------------------------------------------------------------------------------


def test_a_found_config_is_refused_until_trusted_and_again_once_edited(server: FakeServer, tmp_path: Path) -> None:
    repo = cloned_repo(tmp_path, server)
    env = clean_env(tmp_path, SLUICE_TEST_CANARY=CANARY)

    refused = sluice(repo, env, "run", "in.jsonl", "-o", "out.jsonl")
    assert refused.returncode == 2
    assert str(repo / "sluice.toml") in refused.stderr
    assert "is not trusted" in refused.stderr
    assert "could send your API keys to any server" in refused.stderr
    assert "sluice config trust" in refused.stderr
    assert "--config ./sluice.toml" in refused.stderr
    assert CANARY not in refused.stdout + refused.stderr
    assert server.stats.received == 0
    assert not (repo / "out.jsonl").exists()

    check = sluice(repo, env, "config", "check")
    assert check.returncode == 1
    assert "NOT trusted" in check.stdout
    assert server.stats.received == 0

    trusted = sluice(repo, env, "config", "trust")
    assert trusted.returncode == 0, trusted.stderr
    assert server.url in trusted.stdout  # it shows where requests would go
    record = tmp_path / "home" / "trusted.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert str(repo / "sluice.toml") in json.loads(record.read_text())["trusted"]
    assert CANARY not in record.read_text() + trusted.stdout

    check = sluice(repo, env, "config", "check")
    assert check.returncode == 0, check.stderr
    assert "(found in this directory; trusted)" in check.stdout

    done = sluice(repo, env, "run", "in.jsonl", "-o", "out.jsonl")
    assert done.returncode == 0, done.stderr
    assert server.stats.accepted == 3
    assert CANARY not in done.stdout + done.stderr

    with (repo / "sluice.toml").open("a") as f:
        f.write("rpm = 600\n")  # any change of bytes, however innocent-looking
    changed = sluice(repo, env, "run", "in.jsonl", "-o", "again.jsonl")
    assert changed.returncode == 2
    assert "has changed since you trusted it" in changed.stderr
    assert server.stats.received == 3
    assert not (repo / "again.jsonl").exists()


def test_an_explicit_config_needs_no_trust(server: FakeServer, tmp_path: Path) -> None:
    repo = cloned_repo(tmp_path, server)
    env = clean_env(tmp_path, SLUICE_TEST_CANARY=CANARY)
    done = sluice(repo, env, "run", "in.jsonl", "-o", "out.jsonl", "--config", "./sluice.toml")
    assert done.returncode == 0, done.stderr
    assert server.stats.accepted == 3
    assert not (tmp_path / "home" / "trusted.json").exists()
    check = sluice(repo, env, "config", "check", "--config", "sluice.toml")
    assert check.returncode == 0, check.stderr
    assert "given with --config" in check.stdout


def test_revoke_takes_the_trust_back(server: FakeServer, tmp_path: Path) -> None:
    repo = cloned_repo(tmp_path, server)
    env = clean_env(tmp_path, SLUICE_TEST_CANARY=CANARY)
    assert sluice(repo, env, "config", "trust").returncode == 0
    assert sluice(repo, env, "estimate", "in.jsonl").returncode == 0
    revoked = sluice(repo, env, "config", "trust", "--revoke")
    assert revoked.returncode == 0, revoked.stderr
    assert "no longer trusted" in revoked.stdout
    refused = sluice(repo, env, "estimate", "in.jsonl")
    assert refused.returncode == 2
    assert "is not trusted" in refused.stderr


def test_trust_is_per_file_and_kept_by_xdg_config_home(server: FakeServer, tmp_path: Path) -> None:
    repo = cloned_repo(tmp_path, server)
    env = clean_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    del env["SLUICE_TRUST_FILE"]
    assert sluice(repo, env, "config", "trust").returncode == 0
    assert (tmp_path / "xdg" / "sluice" / "trusted.json").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "sluice.toml").write_bytes((repo / "sluice.toml").read_bytes())  # same bytes, another place
    (other / "in.jsonl").write_bytes((repo / "in.jsonl").read_bytes())
    assert "is not trusted" in sluice(other, env, "estimate", "in.jsonl").stderr


def test_load_config_refuses_an_untrusted_found_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLUICE_TRUST_FILE", str(tmp_path / "trust.json"))
    assert load_config(None) == JobConfig()  # no file: defaults
    (tmp_path / "sluice.toml").write_text('model = "simulate/demo"\n')
    with pytest.raises(Exception, match="is not trusted"):
        load_config(None)
    assert load_config(None, require_trust=False).trust == "untrusted"
    assert load_config(Path("sluice.toml")).model == "simulate/demo"


def test_a_damaged_trust_file_is_an_error_not_trust(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text('model = "simulate/demo"\n')
    env = clean_env(tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "trusted.json").write_text("{not json")
    done = sluice(tmp_path, env, "config", "trust")
    assert done.returncode == 2
    assert "is damaged" in done.stderr


# -- config check: missing keys ---------------------------------------------------------------


def test_config_check_exits_1_when_a_key_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "conf.toml"
    config.write_text(
        '[[deployment]]\nmodel = "openai/gpt-4o-mini"\napi_key_env = "SLUICE_TEST_KEY"\n'
        '[[deployment]]\nmodel = "simulate/demo"\n'
    )
    missing = sluice(tmp_path, clean_env(tmp_path), "config", "check", "--config", config)
    assert missing.returncode == 1
    assert "deployment openai/gpt-4o-mini" in missing.stdout  # the table still prints
    assert "$SLUICE_TEST_KEY (NOT SET)" in missing.stdout
    assert (
        "deployment 'openai/gpt-4o-mini': the environment variable $SLUICE_TEST_KEY (its api_key_env) is not set"
        in missing.stderr
    )
    fine = sluice(tmp_path, clean_env(tmp_path, SLUICE_TEST_KEY="sk-x"), "config", "check", "--config", config)
    assert fine.returncode == 0, fine.stderr
    assert "sk-x" not in fine.stdout + fine.stderr


def test_a_self_hosted_openai_server_takes_a_key_too_and_the_message_says_which(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As with the official SDK, a server that needs no key (vLLM, Ollama) is given any."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    local = Deployment("openai/llama", base_url="http://localhost:8000/v1")
    official = Deployment("openai/gpt-4o-mini")
    assert key_source(local) == "$OPENAI_API_KEY (NOT SET)"
    (problem,) = missing_keys(JobConfig(deployments=(local,)))
    assert "no API key; set $OPENAI_API_KEY" in problem
    assert "OPENAI_API_KEY=EMPTY" in problem  # what to do for a server that needs none
    assert missing_keys(JobConfig(deployments=(official,))) == [
        "deployment 'openai/gpt-4o-mini': no API key; set $OPENAI_API_KEY (or name another variable with api_key_env)"
    ]
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    assert missing_keys(JobConfig(deployments=(local, official))) == []


# -- flags that fit the file ----------------------------------------------------------------


def two_deployments() -> JobConfig:
    return JobConfig(deployments=(Deployment("openai/a", rpm=10), Deployment("openai/b", tpm=1000)))


def test_limits_without_model_go_to_models_without_a_deployment() -> None:
    config = with_overrides(two_deployments(), rpm=300, burst_requests=5, burst_tokens=2000)
    assert config.defaults == {"rpm": 300, "burst_requests": 5, "burst_tokens": 2000}
    # configured ones keep their own limits
    assert [(d.model, d.rpm, d.tpm, d.burst_requests) for d in config.deployments] == [
        ("openai/a", 10, None, 0),
        ("openai/b", None, 1000, 0),
    ]
    line = describe_defaults(config)
    assert line is not None
    assert line.startswith("models without a deployment: rpm=300, burst_requests=5, burst_tokens=2000")


def test_limits_with_model_go_to_its_deployment() -> None:
    config = with_overrides(two_deployments(), model="openai/b", rpm=300, burst_requests=5)
    assert config.defaults == {}
    by_model = {d.model: d for d in config.deployments}
    assert (by_model["openai/b"].rpm, by_model["openai/b"].burst_requests, by_model["openai/b"].tpm) == (300, 5, 1000)
    assert by_model["openai/a"].rpm == 10
    made = with_overrides(JobConfig(), model="openai/c", tpm=50)
    assert [(d.model, d.tpm) for d in made.deployments] == [("openai/c", 50)]


def test_limits_without_model_go_to_the_only_deployment() -> None:
    config = with_overrides(JobConfig(deployments=(Deployment("openai/a"),)), rpm=60, burst_tokens=100)
    assert config.defaults == {}
    assert (config.deployments[0].rpm, config.deployments[0].burst_tokens) == (60, 100)


def test_limits_without_model_follow_the_default_model_when_it_has_no_deployment() -> None:
    config = with_overrides(JobConfig(deployments=(Deployment("openai/a"),), model="openai/b"), rpm=60)
    assert config.deployments[0].rpm is None
    assert config.defaults == {"rpm": 60}


def test_estimate_applies_the_defaults_to_each_model_the_file_names(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps({"model": f"openai/m{i % 2}", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
            + "\n"
            for i in range(600)
        )
    )
    config = with_overrides(JobConfig(), rpm=150)
    result = estimate_job(source, config, InputOptions())
    assert sorted(result.tallies) == ["openai/m0", "openai/m1"]
    assert all(t.deployment.rpm == 150 and t.seconds(0) == 120.0 for t in result.tallies.values())


def test_rpm_without_model_on_the_command_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps({"model": "simulate/demo", "messages": [{"role": "user", "content": "x"}]}) + "\n"
            for _ in range(600)
        )
    )
    done = sluice(tmp_path, clean_env(tmp_path), "estimate", source, "--rpm", "300", "--burst", "10")
    assert done.returncode == 0, done.stderr
    assert "600 requests" in done.stdout
    assert "2:00" in done.stdout  # 600 requests at 300/min
    check = sluice(tmp_path, clean_env(tmp_path), "config", "check", "--tpm", "9000", "--burst-tokens", "500")
    assert check.returncode == 0, check.stderr
    assert "models without a deployment: tpm=9000, burst_tokens=500" in check.stdout


# -- prices ---------------------------------------------------------------------------------


def test_a_price_is_the_same_whether_the_url_comes_from_the_config_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://127.0.0.1:9/v1"  # an OpenAI-compatible proxy genai-prices does not know
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    from_config = Pricing().known(Deployment("openai/gpt-4o-mini", base_url=url))
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    from_env = Pricing().known(Deployment("openai/gpt-4o-mini"))
    assert from_config is not None
    assert from_env is not None
    assert from_config.price == from_env.price
    assert from_config.source == from_env.source == "genai-prices: openai/gpt-4o-mini"


def test_a_known_providers_url_prices_by_that_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    groq = Deployment("openai/llama-3.3-70b-versatile", base_url="https://api.groq.com/openai/v1")
    assert "genai-prices: groq/" in Pricing().describe(groq)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.groq.com/openai/v1")
    assert "genai-prices: groq/" in Pricing().describe(Deployment("openai/llama-3.3-70b-versatile"))


def test_describe_says_where_a_price_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    pricing = Pricing()
    configured: dict[str, Any] = {"price": {"input_per_mtok": 1, "output_per_mtok": 2}}
    assert pricing.describe(Deployment("openai/mine", **configured)).endswith("(configured)")
    assert "(genai-prices: openai/gpt-4o-mini)" in pricing.describe(Deployment("openai/gpt-4o-mini"))
    unknown = pricing.describe(Deployment("openai/gpt-test"))
    assert unknown.startswith("unknown: genai-prices has no 'gpt-test' for openai")
    default = describe_defaults(with_overrides(JobConfig(model="openai/gpt-4o-mini"), rpm=5))
    assert default is not None
    assert "price of the default model openai/gpt-4o-mini: $0.15 in" in default
