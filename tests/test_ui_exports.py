"""ui/exports.py: the download files' names and folders."""

import pytest

from ui.exports import write_exports


@pytest.mark.parametrize("run_id", ["../x", "run 1", None])
def test_a_refused_run_id_leaves_no_folder_behind(tmp_path, run_id):
    """Text from a request never reaches a file name; the refusal used to come after the export folder was made."""
    with pytest.raises(ValueError, match="run_id must be a run number"):
        write_exports(tmp_path, None, None, run_id)
    assert list(tmp_path.iterdir()) == []
