"""The laboratory: what measured splitserve, apart from what users install (never packaged).

Run its modules from the checkout's root (`.venv/bin/python -m lab.suite`, `python -m
lab.versus ...`); lab/README.md says what each measures and where its results go.
"""
