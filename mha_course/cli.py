"""The course's command line, all of it: ``python -m mha_course COMMAND`` (or ``mha-course COMMAND``).

Every command's arguments are defined here; each handler imports its tool only when that command
runs, so building the parser imports neither the exercises' checks nor nbformat nor nbclient, and
``--help`` stays quick.

* ``info`` - the package, torch and device in use;
* ``bench`` - :mod:`mha_course.bench`, the timings of chapter 4 (with ``--heads-map``, the map of
  batched against stacked heads of chapter 3; with ``--decode``, the time of generating one
  token with and without a key/value cache, chapter 6; with ``--tiled``, attention with and
  without the score matrix, chapter 7; with ``--grouped``, grouped-query attention beside
  transformers' Llama layer and the fast path, chapters 6 and 8; with ``--latent``, one decoded
  token of latent attention against grouped-query attention, chapter 10; with ``--deltanet``, the
  gated delta rule against softmax attention, chapter 12; with ``--window``, attention under a
  sliding window, chapter 11);
* ``specialise`` - :mod:`mha_course.experiments.specialisation`, the experiment of chapter 5;
* ``student``, ``grade``, ``progress`` and ``lab`` - the student edition, the grader (with a class's
  gradebook), the learner's progress view, and JupyterLab opened on the student edition;
* ``autograder`` - :mod:`mha_course.grading.gradebook`, the zip of a Gradescope autograder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .grading.grading_setup import CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT


def _comma_list(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def _fail(command: str, message: str) -> int:
    print(f"python -m mha_course {command}: error: {message}", file=sys.stderr)
    return 2


def _info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .device import get_device

    print(f"mha_course {__version__}, torch {torch.__version__}, device {get_device()}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import BenchSettings, run_benchmark, summary
    from .device import get_device

    try:
        get_device(args.device, name="--device")
    except (ValueError, RuntimeError) as error:
        return _fail("bench", str(error))
    chosen = [option for option, on in (("--decode", args.decode), ("--heads-map", args.heads_map),
                                        ("--tiled", args.tiled), ("--grouped", args.grouped),
                                        ("--latent", args.latent), ("--deltanet", args.deltanet),
                                        ("--window", args.window)) if on]
    if len(chosen) > 1:
        count = {2: "two", 3: "three"}.get(len(chosen), "four")
        return _fail("bench", f"{' and '.join(chosen)} are {count} different benchmarks: choose one.")
    if args.decode:
        return _bench_decode(args)
    if args.grouped:
        return _bench_grouped(args)
    if args.latent:
        return _bench_latent(args)
    if args.window:
        return _bench_window(args)
    if args.tiled:
        return _bench_tiled(args)
    if args.block_size is not None:
        return _fail("bench", "--block-size applies to --tiled and --window only: add one of them, or leave it out.")
    if args.deltanet:
        return _bench_deltanet(args)
    if args.heads_map:
        return _bench_heads_map(args)
    try:
        settings = BenchSettings.for_command(
            quick=args.quick, configs=_comma_list(args.configs), min_run_time=args.min_run_time,
            rounds=args.rounds, threads=args.threads, device=args.device, memory=not args.no_memory,
            progress=not args.no_progress, label=args.label,
            **{key: value for key, value in (("implementations", _comma_list(args.implementations)),
                                            ("modes", _comma_list(args.modes))) if value},
        )
    except ValueError as error:
        return _fail("bench", str(error))
    return _report_run(run_benchmark(settings), summary, settings.label, args)


def _report_run(results: dict, summarise_run, label: str | None, args: argparse.Namespace) -> int:
    """Write a benchmark run's files, print its summary and, when the machine moved, the warning."""
    from .bench import write_results
    from .bench.machine import untrustworthy_message

    paths = write_results(results, args.out, label=label, plot=not args.no_plot)
    print(summarise_run(results))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    warnings = results["meta"]["stability_warnings"]
    if warnings:
        print("\n" + untrustworthy_message(warnings), file=sys.stderr)
    return 0


def _bench_decode(args: argparse.Namespace) -> int:
    from .bench import DecodeSettings, decode_summary, run_decode_benchmark

    return _fixed_benchmark(args, "--decode", "times one generated token two ways (recompute, kv_cache)",
                            DecodeSettings, run_decode_benchmark, decode_summary)


def _bench_grouped(args: argparse.Namespace) -> int:
    from .bench import GroupedSettings, grouped_summary, run_grouped_benchmark

    return _fixed_benchmark(args, "--grouped", "times each layer beside its reference (course and transformers, "
                            "grouped and fast)", GroupedSettings, run_grouped_benchmark, grouped_summary)


def _bench_window(args: argparse.Namespace) -> int:
    from .bench import WindowSettings, run_window_benchmark, window_summary

    options = {} if args.block_size is None else {"block_size": args.block_size}
    return _fixed_benchmark(args, "--window", "runs attention under every window two ways (tiled, sdpa), forward and "
                            "forward with backward", WindowSettings, run_window_benchmark, window_summary,
                            memory=not args.no_memory, **options)


def _bench_latent(args: argparse.Namespace) -> int:
    from .bench import LatentSettings, latent_summary, run_latent_benchmark

    return _fixed_benchmark(args, "--latent", "times one decoded token four ways (multi_head, grouped_query, latent, "
                            "latent_absorbed)", LatentSettings, run_latent_benchmark, latent_summary)


def _bench_heads_map(args: argparse.Namespace) -> int:
    from .bench import HeadsMapSettings, heads_map_summary, run_heads_map

    return _fixed_benchmark(args, "--heads-map", "times stacked and batched heads forward", HeadsMapSettings,
                            run_heads_map, heads_map_summary)


def _bench_tiled(args: argparse.Namespace) -> int:
    from .bench import TiledSettings, run_tiled_benchmark, tiled_summary

    options = {} if args.block_size is None else {"block_size": args.block_size}
    return _fixed_benchmark(args, "--tiled", "runs attention's middle three ways (scores, tiled, sdpa), forward and "
                            "forward with backward",
                            TiledSettings, run_tiled_benchmark, tiled_summary, memory=not args.no_memory, **options)


def _bench_deltanet(args: argparse.Namespace) -> int:
    from .bench import DeltaNetSettings, deltanet_summary, run_deltanet_benchmark

    return _fixed_benchmark(args, "--deltanet", "runs a prompt three ways (chunked, recurrent, sdpa) and decodes a "
                            "token two ways (kv_cache, state)", DeltaNetSettings, run_deltanet_benchmark,
                            deltanet_summary, memory=not args.no_memory)


def _fixed_benchmark(args: argparse.Namespace, flag: str, does: str, settings_class, run, summarise,
                     **options) -> int:
    """A benchmark whose implementations and modes are fixed (``--decode``, ``--heads-map``, ``--tiled``,
    ``--grouped``):
    refuse ``--implementations``/``--modes``, build its settings from the command line, run, report."""
    for option, value in (("--implementations", args.implementations), ("--modes", args.modes)):
        if value:
            return _fail("bench", f"{option} does not apply to {flag}, which always {does}; leave it out.")
    try:
        settings = settings_class.for_command(
            quick=args.quick, configs=_comma_list(args.configs), min_run_time=args.min_run_time,
            rounds=args.rounds, threads=args.threads, device=args.device, progress=not args.no_progress,
            label=args.label, **options)
    except (ValueError, TypeError) as error:
        return _fail("bench", str(error))
    return _report_run(run(settings), summarise, settings.label, args)


def _add_bench(commands) -> None:
    bench = commands.add_parser(
        "bench", help="time every implementation of causal multi-head attention (writes JSON, CSV, PNG)",
        description="Time the stacked, batched, fused and SDPA implementations (forward and "
        "forward+backward), with peak memory, page faults, multiply-adds and FLOP/s. The matmul ceiling "
        "and the machine's load are measured at the start and the end; a run during which they moved "
        "by more than 10%% ends with a warning that it is not trustworthy.")
    bench.add_argument("--quick", action="store_true", help="tiny sizes and short timings (seconds; for CI)")
    bench.add_argument("--decode", action="store_true",
                       help="time one generated token with and without a KV cache, at several lengths "
                       "(chapter 6; writes bench-decode-DEVICE.json, .csv, .png)")
    bench.add_argument("--heads-map", action="store_true",
                       help="time batched against stacked heads over sequence lengths x numbers of heads at one "
                       "model width, with the processor's cache sizes (chapter 3; writes bench-heads-map-DEVICE.json, "
                       ".csv, .png)")
    bench.add_argument("--tiled", action="store_true",
                       help="attention with the explicit scores, the tiled loop and the fused kernel, against the "
                       "length, forward and forward with backward (chapter 7; writes bench-tiled-DEVICE.json, .csv, .png)")
    bench.add_argument("--grouped", action="store_true",
                       help="grouped-query attention on the fused kernel beside transformers' LlamaAttention (a "
                       "1,024-token prompt, one token after 1,024 cached) and beside the fast path (chapters 6 "
                       "and 8; writes bench-grouped-DEVICE.json, .csv)")
    bench.add_argument("--latent", action="store_true",
                       help="time one decoded token after up to 16k cached ones: latent attention expanded and absorbed "
                       "against grouped-query attention with the same cache (chapter 10; writes bench-latent-DEVICE.json, "
                       ".csv, .png)")
    bench.add_argument("--deltanet", action="store_true",
                       help="a prompt through the gated delta rule, chunked and recurrent, and softmax attention up to "
                       "16k tokens, and one decoded token with a key/value cache against a fixed state (chapter 12; "
                       "writes bench-deltanet-DEVICE.json, .csv, .png)")
    bench.add_argument("--window", action="store_true",
                       help="attention under a sliding window, the tiled loop against the fused kernel given the "
                       "mask, at 8k and 16k tokens, forward and forward with backward (chapter 11; writes "
                       "bench-window-DEVICE.json, .csv, .png)")
    bench.add_argument("--block-size", type=int, default=None,
                       help="with --tiled or --window: queries and keys per tile of the tiled loop (default: 64 "
                       "for --tiled, 128 for --window; quick: 8)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    bench.add_argument("--out", default="bench-results", help="folder for the results (default: bench-results)")
    bench.add_argument("--label", default=None, help="suffix of the file names, e.g. bench-cpu-LABEL.json")
    bench.add_argument("--configs", default=None,
                       help="comma-separated sizes (default: all of the mode; with --decode, decode-16 ... decode-1024)")
    bench.add_argument("--implementations", default=None, help="comma-separated implementations (default: all)")
    bench.add_argument("--modes", default=None, help="comma-separated: forward, forward+backward (default: both)")
    bench.add_argument("--min-run-time", type=float, default=None,
                       help="seconds of timing per implementation, over all rounds (default 1.0; quick 0.02)")
    bench.add_argument("--rounds", type=int, default=None,
                       help="timing rounds: the implementations take turns (default 3; quick 2; calls over 1 s: 2)")
    bench.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice; quick: 1)")
    bench.add_argument("--no-memory", action="store_true", help="skip peak-memory and page-fault measurements")
    bench.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    bench.set_defaults(handler=_bench)


def _specialise(args: argparse.Namespace) -> int:
    from .experiments.specialisation import (validate_experiment_arguments, run_experiment, save_results,
                                             summary_table)

    try:
        validate_experiment_arguments(args.seeds)
    except ValueError as error:
        return _fail("specialise", f"--{error} The book uses --seeds 8.")
    out = Path(args.out)
    if out.is_dir():
        return _fail("specialise", f"--out {out} is a folder; give a file name, e.g. --out "
                     f"{out / 'specialisation.json'}.")
    results = run_experiment(args.seeds, progress=not args.no_progress)
    try:
        save_results(results, out)
    except OSError as error:
        return _fail("specialise", f"could not write --out {out}: {error.strerror or error}.")
    print(summary_table(results))
    print(f"wrote {out}")
    return 0


def _add_specialise(commands) -> None:
    specialise = commands.add_parser(
        "specialise", help="train the tiny 1-, 2- and 4-head models of chapter 5 and write their results")
    specialise.add_argument("--seeds", type=int, default=8, help="seeds per head count (default 8)")
    specialise.add_argument("--out", default="book/data/specialisation.json",
                            help="JSON file to write (default book/data/specialisation.json)")
    specialise.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    specialise.set_defaults(handler=_specialise)


def _student(args: argparse.Namespace) -> int:
    from .edition import student

    return student.main(args)


def _grade(args: argparse.Namespace) -> int:
    from .grading import gradebook

    return gradebook.main(args)


def _autograder(args: argparse.Namespace) -> int:
    from .grading import gradebook

    return gradebook.autograder(args)


def _progress(args: argparse.Namespace) -> int:
    from .grading import progress

    return progress.main(args)


def _lab(args: argparse.Namespace) -> int:
    from .edition import lab

    return lab.main(args)


def _add_student_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK",
                        help="source notebooks (default: every notebook in book/)")
    parser.add_argument("--out", type=Path, default=Path("student"),
                        help="folder to write the student edition into (default: student/)")
    parser.add_argument("--force", action="store_true", help="overwrite notebooks that already exist")
    parser.add_argument("--book", action="store_true",
                        help="also copy _config.yml, _toc.yml and book/ so that `jupyter-book build OUT` "
                             "builds the HTML book without solutions")


GRADE_EXIT_STATUS = ("exit status: 0 when every exercise graded passed, 1 when one did not or a notebook had none "
                     "to grade (or grading cannot run here), 2 for a mistake on the command line or a sandbox "
                     "required and missing; a classroom runner "
                     "can score by it")


def _add_grade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK",
                        help="completed notebooks to grade (each runs on a copy; the file is not changed)")
    parser.add_argument("--submissions", type=Path, metavar="DIR",
                        help="grade every notebook under each subfolder of DIR, the subfolder's name being the "
                             "student's (instead of NOTEBOOK...)")
    parser.add_argument("--chapters", metavar="N,M", default=None,
                        help="chapters whose exercises count even where no notebook of them was handed in "
                             "(default: the chapters of the notebooks graded)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the scores as JSON to FILE")
    parser.add_argument("--csv", type=Path, metavar="FILE",
                        help="write the gradebook to FILE: a row per student and exercise (student, notebook, "
                             "exercise, status, points, max points, checks passed, checks total, notes, flags)")
    parser.add_argument("--totals", type=Path, metavar="FILE",
                        help="write each student's total to FILE, a CSV for a learning platform's import (student, "
                             "points, max points, exercises passed, flags)")
    parser.add_argument("--feedback", type=Path, metavar="DIR",
                        help="write one short feedback file per student into DIR (STUDENT.txt)")
    parser.add_argument("--partial", action="store_true",
                        help="points are the share of an exercise's checks of behaviour passed (default: 1 for a "
                             "pass, else 0)")
    parser.add_argument("--gradescope", type=Path, metavar="FILE",
                        help="write Gradescope's results.json for one submission to FILE")
    parser.add_argument("--seed", type=int, default=None, metavar="SEED",
                        help="draw the checks' inputs from SEED (a report's \"seed\"): a regrade with it draws the "
                             "same inputs and gives the same verdicts (default: a fresh seed per notebook)")
    parser.add_argument("--require-sandbox", action="store_true",
                        help="refuse to grade (exit status 2) where no sandbox can start (bubblewrap, Linux)")
    parser.add_argument("--in-container", action="store_true",
                        help="this grading runs in a container of its own for one submission (Gradescope): start "
                             "no sandbox, and record sandbox: container")
    _add_limit_arguments(parser, jobs=1)


def _add_autograder_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, metavar="FILE.zip", help="the zip file to write")
    parser.add_argument("--chapters", metavar="N,M", default=None,
                        help="the chapters the assignment asks for: their exercises count even when a submission "
                             "lacks their notebook (default: those of the notebooks submitted)")
    parser.add_argument("--partial", action="store_true",
                        help="points are the share of an exercise's checks of behaviour passed")
    parser.add_argument("--timeout", type=float, default=NOTEBOOK_TIMEOUT, metavar="SECONDS",
                        help=f"how long each notebook may run (default: {NOTEBOOK_TIMEOUT:g})")


def _add_limit_arguments(parser: argparse.ArgumentParser, jobs: int) -> None:
    """The grader's time limits and parallelism (``grade`` and ``progress``)."""
    parser.add_argument("--timeout", type=float, default=NOTEBOOK_TIMEOUT, metavar="SECONDS",
                        help=f"how long each notebook may run before it is stopped (default: {NOTEBOOK_TIMEOUT:g})")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, metavar="SECONDS",
                        help=f"how long one cell may run before it is interrupted (default: {CELL_TIMEOUT:g})")
    parser.add_argument("--check-timeout", type=float, default=CHECK_TIMEOUT, metavar="SECONDS",
                        help=f"how long the answer to one exercise may run while being checked (default: "
                             f"{CHECK_TIMEOUT:g})")
    parser.add_argument("--jobs", type=int, default=jobs, metavar="N",
                        help=f"notebooks graded at the same time (default: {jobs}); with more than one, an edit to "
                             "the package's files withholds the score of every notebook running when it is found")


def _add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", type=Path, default=Path("student"),
                        help="the folder with your chapter notebooks (default: student/)")
    _add_limit_arguments(parser, jobs=2)


def _add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("student"),
                        help="the folder of the student edition to open (default: student/)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser (print the address)")
    parser.add_argument("--port", type=int, default=None, help="the port JupyterLab listens on")
    parser.add_argument("jupyter_args", nargs=argparse.REMAINDER, metavar="-- ARGUMENTS",
                        help="anything after -- is passed on to jupyter lab")


def _add_exercise_commands(commands) -> None:
    student = commands.add_parser("student", help="write the student edition of the chapter notebooks "
                                  "(solutions replaced by stubs, the exercises' outputs cleared)")
    _add_student_arguments(student)
    student.set_defaults(handler=_student)
    grade = commands.add_parser("grade", help="execute completed notebooks and score their exercises",
                                description="Execute completed notebooks, or a class's folder of submissions, "
                                "and score their exercises; print the scores, and write a gradebook on request.",
                                epilog=GRADE_EXIT_STATUS)
    _add_grade_arguments(grade)
    grade.set_defaults(handler=_grade)
    autograder = commands.add_parser("autograder", help="write the autograder zip that Gradescope takes",
                                     description="Write the zip of a Gradescope autograder: setup.sh installs the "
                                     "course with what grading needs (pinned), run_autograder grades the submission.")
    _add_autograder_arguments(autograder)
    autograder.set_defaults(handler=_autograder)
    progress = commands.add_parser("progress", help="show which exercises of each chapter pass, fail or are not "
                                   "started (reuses the last grading of unchanged notebooks)")
    _add_progress_arguments(progress)
    progress.set_defaults(handler=_progress)
    lab = commands.add_parser("lab", help="write the student edition into student/ where a notebook is missing "
                              "(never overwriting your work) and open JupyterLab on it")
    _add_lab_arguments(lab)
    lab.set_defaults(handler=_lab)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = argparse.ArgumentParser(prog="python -m mha_course", description="The course's command line.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="print the package, torch and device in use")
    info.set_defaults(handler=_info)
    _add_bench(commands)
    _add_specialise(commands)
    _add_exercise_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments) and run the command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)
