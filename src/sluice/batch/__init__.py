"""Batch jobs: input files streamed through the engine into output files, resumably."""
