"""The one check every front end's refusal meets (the CLI's verbs, the recipes): exit code 2, one `error: ...` line
on stderr, the last, and no traceback."""

from __future__ import annotations

import pytest


def one_line_refusal(capsys, main, argv, *, alone: bool = False) -> str:
    """Run `main(argv)`, which must refuse; return its `error:` line. `alone`: nothing else on stderr either."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, (stop.value.code, err)
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    assert sum(line.startswith("error: ") for line in err) == 1, err
    assert not alone or len(err) == 1, err
    return err[-1]
