"""Routing: the staged router (snapshot → filter → score → select → assign) and its policies.

Each policy is one module exposing ``NAME`` and a constructor; :mod:`.registry` maps names to
constructors.
"""
