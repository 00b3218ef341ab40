"""The `hf-posenc` command: methods, inspect, patch, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import api, assets, loading
from .errors import PosEncError
from .registry import list_methods


def _value(text: str):
    """A --param value: JSON when it parses (numbers, lists, true/false/null), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _params(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--param takes key=value, got {pair!r}")
        out[key.replace("-", "_")] = _value(value)
    return out


def cmd_methods(args) -> None:
    methods = list_methods()
    if args.json:
        print(json.dumps(methods, indent=2, default=str))
        return
    for m in methods:
        print(f"{m['name']:<13} [{', '.join(m['mechanisms'])}]  {m['summary']}")
        for name, default in m["parameters"].items():
            print(f"    {name} = {default!r}")


def cmd_inspect(args) -> None:
    info = api.describe(loading.meta_model(assets.resolve_alias(args.model), gguf_file=args.gguf_file))
    print(json.dumps(info, indent=2, default=str))


def cmd_patch(args) -> None:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise SystemExit(f"output folder {out} exists and is not empty; pass --overwrite to replace it")
    params = _params(args.param)
    if args.max_position_embeddings is not None:
        params["max_position_embeddings"] = args.max_position_embeddings
    if args.factor is not None:
        params["factor"] = args.factor
    # Check method and parameters before loading any weights.
    from .registry import get_method

    get_method(args.method).from_dict(params)
    ref = assets.resolve_alias(args.model)
    model = loading.load_model(ref, gguf_file=args.gguf_file)
    api.patch(model, args.method, **params)
    model.save_pretrained(out)
    try:
        loading.load_tokenizer(ref, gguf_file=args.gguf_file).save_pretrained(out)
    except (OSError, ValueError) as err:
        print(f"note: no tokenizer saved ({err})", file=sys.stderr)
    print(json.dumps(api.describe(model), indent=2, default=str))
    print(f"saved to {out}")


def cmd_demo(args) -> None:
    from . import demo

    methods = tuple(args.methods.split(",")) if args.methods else demo.DEMO_METHODS
    demo.run(tokens=args.tokens, methods=methods, dtype=args.dtype, play=args.play)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posenc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("methods", help="every method, the mechanisms it applies to, its parameters")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("inspect", help="family, mechanism, context and rope parameters of a model")
    p.add_argument("model", help="hub id, local folder, .gguf file, or 'smollm2' / 'minilm' (embedded)")
    p.add_argument("--gguf-file")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("patch", help="patch a model and save it")
    p.add_argument("model", help="hub id, local folder, .gguf file, or 'smollm2' / 'minilm' (embedded)")
    p.add_argument("--method", required=True)
    p.add_argument("--max-position-embeddings", type=int)
    p.add_argument("--factor", type=float)
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="a method parameter (repeatable)")
    p.add_argument("--gguf-file")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("demo", help="patch the embedded SmolLM2-135M with every RoPE method and compare")
    p.add_argument("--tokens", type=int, default=512, help="length of the comparison text (default 512)")
    p.add_argument("--methods", help="comma-separated subset of the RoPE methods")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--play", default="hamlet")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (PosEncError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
