"""Agents written with agent frameworks, unchanged, in importable modules (as a user's would be): the
frameworks build tools and models as objects, which travel to the env procs with their module."""
