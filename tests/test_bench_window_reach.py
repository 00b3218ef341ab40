"""benchmarks/bench_window_reach.py: how far back a fine-tune's scored tokens reach, read from the recipe's own
windows (a tiny Llama, a byte-level corpus)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_window_reach  # noqa: E402
import common  # noqa: E402

from hf_posenc.train.positions import scheme  # noqa: E402
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model, write_corpus  # noqa: E402

TEXT = "".join(f"Line {i}: the king speaks of {i * 7 % 13} ravens.\n" for i in range(200))


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    root = tmp_path_factory.mktemp("reach")
    save_text_models(root, llama=tiny_model(vocab_size=TINY_TEXT_VOCAB))   # 64 positions
    write_corpus(root / "corpus", TEXT)
    return ["--model.name", str(root / "llama"), "--data.corpus", str(root / "corpus"), "--data.seq_len", "32",
            "--posenc.method", "linear", "--posenc.factor", "4", "--train.steps", "6", "--train.warmup_steps", "1", "--data.shuffle", "false"]


def test_contiguous_windows_reach_no_further_than_the_window(args):
    reached, _ = bench_window_reach.reach(args)
    assert len(reached) == 6 * 32
    np.testing.assert_array_equal(reached, np.tile(np.arange(32), 6))


def test_pose_windows_reach_the_ids_the_scheme_draws_for_each_window(args):
    reached, cfg = bench_window_reach.reach([*args, "--train.positions", "pose chunks=2", "--train.seed", "3"])
    pose = scheme("pose chunks=2", target=256)
    drawn = np.concatenate([pose.position_ids(32, seed=3, index=i).numpy() for i in range(6)])
    np.testing.assert_array_equal(reached, drawn)
    assert reached.max() >= 32   # past the window: what the scheme is for


def test_the_script_prints_the_shares_and_refuses_a_bad_flag_in_one_line(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_window_reach.py", *args, "--bin", "8"])
    bench_window_reach.main()
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "share" not in line]
    assert table == [f"| {low}-{low + 8} | 0.250 |" for low in (0, 8, 16, 24)]
    monkeypatch.setattr(sys, "argv", ["bench_window_reach.py", *args, "--train.positions", "bogus"])
    with pytest.raises(SystemExit) as stop:
        common.run(bench_window_reach.main)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.positions='bogus': unknown position scheme"), lines
