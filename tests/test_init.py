"""The package's lazy exports (`dflash/__init__.py`): loaded on first use, listed like ordinary attributes."""

from __future__ import annotations

import dflash


def test_dir_lists_the_lazy_exports():
    """Before: dir(dflash) did not list DFlashModel, Engine, … (PEP 562 __getattr__ without __dir__)."""
    names = dir(dflash)
    for name in dflash.__all__:
        assert name in names
        assert getattr(dflash, name) is not None
    assert "__version__" in names
