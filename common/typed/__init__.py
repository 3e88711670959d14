"""Typed values from decoded JSON: the one parser of the frozen dataclasses that travel as JSON, the run's
settings sections (``common/run/settings.py``, each method's slice) and the steps' instructions
(``common/wire/instructions.py``). It imports nothing of the project: both of those packages stand on it."""
