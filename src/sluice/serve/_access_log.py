"""``sluice serve``'s access log: aiohttp's, less the dashboard's own polls.

A dashboard open in a tab asks for ``/dashboard/data`` every two seconds, for as long as
it stays open: at INFO those lines would bury the API traffic the log is for. A poll that
was answered (below 400) is logged at DEBUG, in one short line; a refused one (a wrong key,
an expired session) stays at INFO, like every other request.
"""

from __future__ import annotations

import logging

from aiohttp import web_log
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from .dashboard._dashboard import DASHBOARD

__all__ = ["AccessLogger"]

_POLL = DASHBOARD + "/data"


class AccessLogger(web_log.AccessLogger):
    """aiohttp's access logger, with the dashboard's answered polls at DEBUG."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if request.path == _POLL and response.status < 400:
            if self.logger.isEnabledFor(logging.DEBUG):
                self.logger.debug("%s %s %s (a dashboard poll)", request.method, request.path, response.status)
            return
        super().log(request, response, time)
