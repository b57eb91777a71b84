"""Everything that configures a benchmark run, checked once.

:class:`BenchSettings` for the implementations of chapter 4, :class:`DecodeSettings` for the decoding
benchmark of chapter 6 (``bench --decode``), :class:`HeadsMapSettings` for the heads map of chapter 3
(``bench --heads-map``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from typing import ClassVar, Sequence

from ..attention._validation import validate_non_negative_int, validate_positive_int
from ..implementations import IMPLEMENTATIONS, validate_names
from .sizes import (ALL_CONFIGS, ALL_DECODE_CONFIGS, ALL_HEADS_MAP_CONFIGS, CONFIGS, DECODE_CONFIGS,
                    HEADS_MAP_CONFIGS, QUICK_CONFIGS, QUICK_DECODE_CONFIGS, QUICK_HEADS_MAP_CONFIGS, BenchConfig)
from .steps import MODES


def _positive(name: str, value) -> None:
    """A positive real number (a whole number goes through ``validate_positive_int``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")


@dataclass(frozen=True)
class RunSettings:
    """What every benchmark run shares: the sizes, the device, how long to time, the threads, the files' label.

    The two kinds of run, :class:`BenchSettings` and :class:`DecodeSettings`, add their own fields.
    """

    configs: Sequence[BenchConfig]  # the sizes to run
    device: str = "cpu"  # "cpu" or "cuda"
    # Seconds torch.utils.benchmark spends on each way of computing, shared among the rounds.
    min_run_time: float = 1.0
    # Every way of computing is timed once per round, in turns (mha_course.timing.time_interleaved).
    rounds: int = 3
    threads: int | None = None  # torch threads (None: torch's current setting)
    progress: bool = True  # a progress bar on stderr
    quick: bool = False  # recorded in the results' metadata
    ceiling_size: int | None = None  # side of the square matrix product timed as the ceiling
    seed: int = 0
    label: str | None = field(default=None, compare=False)  # suffix of the result files' names

    #: A size to name in the error for bad ``configs``.
    example_config: ClassVar[str] = "CONFIGS['small-4']"

    def __post_init__(self):
        configs = tuple(self.configs)
        if not configs or not all(isinstance(c, BenchConfig) for c in configs):
            raise ValueError("configs must be a non-empty sequence of BenchConfig, e.g. "
                             f"(mha_course.bench.{self.example_config},).")
        object.__setattr__(self, "configs", configs)
        _positive("min_run_time", self.min_run_time)
        validate_positive_int("rounds", self.rounds)
        if self.threads is not None:
            validate_positive_int("threads", self.threads)
        if self.ceiling_size is not None:
            validate_positive_int("ceiling_size", self.ceiling_size)

    @classmethod
    def _for_command(cls, known: dict, pool: dict, *, quick: bool, configs: Sequence[str] | None,
                     min_run_time: float | None, rounds: int | None, threads: int | None, **options):
        """Sizes by name (default: all of ``pool``), and the defaults of the command's full or quick run."""
        names = validate_names(configs if configs else pool, known, "configs")
        settings = cls(
            configs=tuple(known[name] for name in names),
            min_run_time=min_run_time if min_run_time is not None else (0.02 if quick else 1.0),
            rounds=rounds if rounds is not None else (2 if quick else 3),
            threads=threads if threads is not None else (1 if quick else None),
            quick=quick,
            ceiling_size=256 if quick else None,
            **options,
        )
        return replace(settings, label=settings.label if settings.label is not None else ("quick" if quick else None))


@dataclass(frozen=True)
class BenchSettings(RunSettings):
    """How to run the benchmark: what to time, where, for how long, and what else to measure.

    Example:
        >>> settings = BenchSettings(configs=(CONFIGS["textbook"],), implementations=("batched", "fast"))
        >>> settings.modes, settings.rounds
        (('forward', 'forward+backward'), 3)
        >>> BenchSettings(configs=(CONFIGS["textbook"],), modes=("backward",))
        Traceback (most recent call last):
            ...
        ValueError: unknown modes ['backward']: choose from forward, forward+backward.
    """

    implementations: Sequence[str] = tuple(IMPLEMENTATIONS)  # names from mha_course.implementations
    modes: Sequence[str] = MODES
    memory: bool = True  # peak memory (and, on the CPU, page faults per call)
    # Calls over which page faults per call are averaged, after the first (none for slow training steps).
    memory_calls: int = 2

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "implementations",
                           tuple(validate_names(self.implementations, IMPLEMENTATIONS, "implementations")))
        object.__setattr__(self, "modes", tuple(validate_names(self.modes, MODES, "modes")))
        validate_non_negative_int("memory_calls", self.memory_calls)

    @classmethod
    def for_command(cls, *, quick: bool = False, configs: Sequence[str] | None = None,
                    min_run_time: float | None = None, rounds: int | None = None, threads: int | None = None,
                    **options) -> "BenchSettings":
        """The settings of ``python -m mha_course bench``: sizes by name, and the defaults of its mode.

        The full run times each implementation for 1 s over 3 rounds with torch's threads; the
        quick run (``quick=True``) uses its tiny sizes, 0.02 s over 2 rounds, one thread (on a
        shared CI machine a spinning second thread makes tiny timings swing by 10x) and a small
        ceiling product.

        Example:
            >>> s = BenchSettings.for_command(quick=True)
            >>> [c.name for c in s.configs], s.min_run_time, s.rounds, s.threads
            (['textbook', 'tiny'], 0.02, 2, 1)
        """
        return cls._for_command(ALL_CONFIGS, QUICK_CONFIGS if quick else CONFIGS, quick=quick, configs=configs,
                                min_run_time=min_run_time, rounds=rounds, threads=threads, memory_calls=1,
                                **options)


@dataclass(frozen=True)
class DecodeSettings(RunSettings):
    """How to run the decoding benchmark (``bench --decode``): one generated token, with and without a cache.

    Its sizes are lengths (DECODE_CONFIGS or QUICK_DECODE_CONFIGS values), and the two ways of
    decoding, recompute and kv_cache, take turns in every round.

    Example:
        >>> s = DecodeSettings.for_command(quick=True)
        >>> [c.name for c in s.configs], s.min_run_time, s.rounds, s.threads, s.label
        (['decode-tiny-8', 'decode-tiny-32'], 0.02, 2, 1, 'quick')
        >>> DecodeSettings.for_command(configs=["decode-16", "small-4"])
        Traceback (most recent call last):
            ...
        ValueError: unknown configs ['small-4']: choose from decode-16, decode-32, decode-64, decode-128, decode-256, decode-512, decode-1024, decode-tiny-8, decode-tiny-32.
    """

    example_config: ClassVar[str] = "DECODE_CONFIGS['decode-256']"

    @classmethod
    def for_command(cls, *, quick: bool = False, configs: Sequence[str] | None = None,
                    min_run_time: float | None = None, rounds: int | None = None, threads: int | None = None,
                    **options) -> "DecodeSettings":
        """The settings of ``python -m mha_course bench --decode``, with the defaults of ``bench``."""
        return cls._for_command(ALL_DECODE_CONFIGS, QUICK_DECODE_CONFIGS if quick else DECODE_CONFIGS,
                                quick=quick, configs=configs, min_run_time=min_run_time, rounds=rounds,
                                threads=threads, **options)


@dataclass(frozen=True)
class HeadsMapSettings(RunSettings):
    """How to run the heads map (``bench --heads-map``): batched over stacked heads, forward, at every cell.

    Its sizes are the cells of a map (HEADS_MAP_CONFIGS or QUICK_HEADS_MAP_CONFIGS values), and the
    two implementations, stacked and batched, take turns in every round.

    Example:
        >>> s = HeadsMapSettings.for_command(quick=True)
        >>> len(s.configs), s.configs[0].name, s.min_run_time, s.threads
        (6, 'map-tiny-T8-h1', 0.02, 1)
        >>> HeadsMapSettings.for_command(configs=["small-4"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        ValueError: unknown configs ['small-4']: choose from map-T32-h1, map-T32-h2, ..., map-tiny-T16-h4.
    """

    example_config: ClassVar[str] = "HEADS_MAP_CONFIGS['map-T256-h4']"

    @classmethod
    def for_command(cls, *, quick: bool = False, configs: Sequence[str] | None = None,
                    min_run_time: float | None = None, rounds: int | None = None, threads: int | None = None,
                    **options) -> "HeadsMapSettings":
        """The settings of ``python -m mha_course bench --heads-map``, with the defaults of ``bench``."""
        return cls._for_command(ALL_HEADS_MAP_CONFIGS, QUICK_HEADS_MAP_CONFIGS if quick else HEADS_MAP_CONFIGS,
                                quick=quick, configs=configs, min_run_time=min_run_time, rounds=rounds,
                                threads=threads, **options)
