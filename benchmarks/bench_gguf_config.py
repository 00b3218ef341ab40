"""The config of a GGUF file: transformers' own reading against hf_posenc's header-only reading.

transformers builds a llama-architecture GGUF file's config through `gguf.GGUFReader`, which maps the whole
file and makes a numpy view of every element of every metadata array (the tokenizer's ~49k strings on
SmolLM2); `hp.load_config` reads the same config from the file's header alone
(`hf_posenc.export.gguf_header.config_only`). Both read the embedded SmolLM2 GGUF --repeats times, alternating; the
median wall time of each, their ratio, and whether the two configs are equal.

    python benchmarks/bench_gguf_config.py --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import common
import transformers

from hf_posenc import assets
from hf_posenc.export import gguf_header


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=common.count(1), default=3)
    args = parser.parse_args()
    path = assets.smollm2_gguf()
    seconds = {"transformers": [], "header only": []}
    configs = {}
    for _ in range(args.repeats):
        for name in seconds:
            started = time.perf_counter()
            with gguf_header.config_only() if name == "header only" else contextlib.nullcontext():
                configs[name] = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
            seconds[name].append(time.perf_counter() - started)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    print(json.dumps({
        "machine": common.machine(), "file": path.name, "repeats": args.repeats,
        "median_seconds": median, "ratio": median["transformers"] / median["header only"],
        "same_config": configs["transformers"] == configs["header only"],
    }, indent=2))


if __name__ == "__main__":
    common.run(main)
