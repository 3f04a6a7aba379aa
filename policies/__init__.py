"""The policy presets, installed as the data package ``router.policies`` (see router/presets.py).

The package exists only so that importlib.resources can find the YAML files beside it.
"""
