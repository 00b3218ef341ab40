"""The `hf-posenc` command: methods, inspect, patch, demo, plot."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import api, assets, loading
from .config import parse_params
from .errors import InvalidParameterError, PosEncError
from .registry import list_methods


def _params(pairs: list[str]) -> dict:
    try:
        return {key.replace("-", "_"): value for key, value in parse_params(pairs or []).items()}
    except InvalidParameterError as err:
        raise SystemExit(f"--param: {err}") from None


def _method_params(args) -> dict:
    """--param pairs plus --max-position-embeddings / --factor, as hp.patch keywords."""
    params = _params(args.param)
    if args.max_position_embeddings is not None:
        params["max_position_embeddings"] = args.max_position_embeddings
    if args.factor is not None:
        params["factor"] = args.factor
    return params


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
    params = _method_params(args)
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
    long_variants = tuple(args.long_variants.split(",")) if args.long_variants else demo.LONG_VARIANTS
    try:
        demo.run(args.model, tokens=args.tokens, methods=methods, long_tokens=args.long_tokens,
                 long_variants=long_variants, dtype=args.dtype, corpus=args.corpus, out=args.out)
    except ValueError as err:  # a text too short, a bad variant: say it without a traceback
        raise SystemExit(f"error: {err}") from None


def cmd_plot(args) -> None:
    import torch

    from . import analysis
    from .registry import get_method

    asked = [w for w in args.what.split(",") if w]
    unknown = [w for w in asked if w not in (*analysis.PLOTS, "all")]
    if unknown:
        raise SystemExit(f"error: unknown plot(s) {unknown}; known: {', '.join(analysis.PLOTS)}, all")
    params = _method_params(args)
    methods = [m for group in args.method or [] for m in group.split(",") if m]
    for method in methods:  # check names and parameters before loading any weights
        get_method(method).from_dict(params)
    lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else None
    ref = assets.resolve_alias(args.model)
    model = api.from_pretrained(ref, gguf_file=args.gguf_file, dtype=getattr(torch, args.dtype)).eval()
    mechanism = analysis.mechanism(model)
    wanted = [w for group in asked for w in (analysis.plots_for(model) if group == "all" else [group])]
    for what in wanted:
        if what not in analysis.PLOTS_FOR[mechanism]:
            raise SystemExit(f"error: the {what} plot does not apply to this {model.config.model_type} model's "
                             f"{mechanism} positions; plots that do: {', '.join(analysis.PLOTS_FOR[mechanism])}")
    results = []
    for what in wanted:
        if what == "table":
            for method in [None, *methods]:
                results.append(analysis.plot_table(model, args.out, method=method, **(params if method else {})))
        elif what == "similarity":
            results.append(analysis.plot_similarity(model, args.out, measure=args.measure,
                                                    variants=args.variants.split(","), **params))
        elif what in ("wavelengths", "decay"):
            results.append(analysis.PLOTS[what](model, args.out, methods=methods or analysis.rope.DEFAULT_METHODS,
                                                **params))
        else:
            tokenizer = loading.load_tokenizer(ref, gguf_file=args.gguf_file)
            ids = tokenizer(assets.shakespeare_text(args.play), return_tensors="pt", verbose=False).input_ids[0]
            default = {"rope": ["yarn"], "learned": ["interpolate"]}[mechanism]
            shown = lengths or "half the original context and the new one"
            print(f"attention: {args.play}, lengths {shown}, methods {methods or default} (eager attention: "
                  f"minutes on a CPU past a few thousand tokens)", file=sys.stderr)
            results.append(analysis.plot_attention(model, ids, args.out, lengths=lengths, methods=methods or default,
                                                   queries=args.queries, **params))
    for result in results:
        extra = {k: result.info[k] for k in ("check_relative", "check_rotation") if k in result.info}
        print(f"{result.png}  (+ .csv, .json){'  ' + json.dumps(extra) if extra else ''}")


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
    p.add_argument("--model", default="smollm2", help="a RoPE causal LM (default: the embedded SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the comparison inside the context (default 512)")
    p.add_argument("--methods", help="comma-separated subset of the RoPE methods")
    p.add_argument("--long-tokens", type=int, default=16384,
                   help="longest length of part 2, perplexity against length and the passkey (default 16384, "
                        "twice SmolLM2's context; 0 skips part 2)")
    p.add_argument("--long-variants", help="comma-separated variants of part 2 (default none,linear,ntk,dynamic,yarn,"
                                           "dynamic_yarn; fewer for a quicker run)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--corpus", default="shakespeare:hamlet", help="text to read (a load_corpus spec; first document)")
    p.add_argument("--out", default="runs/demo", help="folder of the figure (default runs/demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("plot", help="plots of a model's positional mechanism: PNG, with the numbers as CSV and JSON")
    p.add_argument("model", help="hub id, local folder, .gguf file, or 'smollm2' / 'minilm' (embedded)")
    p.add_argument("--what", default="all",
                   help="comma-separated: table, similarity (position tables), wavelengths, decay (RoPE), attention; "
                        "'all' (default): those that apply to the model")
    p.add_argument("--method", action="append", metavar="METHOD[,METHOD...]",
                   help="table: one more plot per method, patched; wavelengths, decay: the methods compared "
                        "(default linear,ntk,yarn,llama3); attention: the patches (default yarn / interpolate)")
    p.add_argument("--max-position-embeddings", type=int, help="the target context (default: 2x the original)")
    p.add_argument("--factor", type=float)
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="a method parameter (repeatable)")
    p.add_argument("--variants", default="model,sinusoidal,fit,interpolate",
                   help="similarity: the tables compared (model, sinusoidal, scaled, fit, interpolate, tile)")
    p.add_argument("--measure", default="cosine", choices=["cosine", "dot"], help="similarity: the measure")
    p.add_argument("--lengths", help="attention: comma-separated text lengths in tokens "
                                     "(default: half the original context, and the new one)")
    p.add_argument("--queries", type=int, default=256, help="attention: the last N queries of each text")
    p.add_argument("--play", default="hamlet", help="attention: the Shakespeare play used as text")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--gguf-file")
    p.add_argument("--out", required=True, help="the folder the plots go to")
    p.set_defaults(func=cmd_plot)
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
