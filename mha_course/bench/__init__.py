"""The course's benchmark: what each implementation of causal multi-head attention costs.

``python -m mha_course bench`` times, in one process and one run, every implementation of
:mod:`mha_course.implementations` (stacked heads, the textbook batched module, the fused fast
path, raw ``scaled_dot_product_attention``, ``torch.nn.MultiheadAttention``) on the same weights
and the same input, at the sizes of :mod:`mha_course.bench.sizes`, forward and forward+backward,
with peak memory, page faults, multiply-adds and FLOP/s. Results go to ``--out`` as JSON
(everything), CSV (one row per measurement) and a PNG plot; chapter 4 reads the stored files.

The package, one concern per module:

* :mod:`~mha_course.bench.sizes` - the sizes (adding one is one entry);
* :mod:`~mha_course.bench.settings` - :class:`BenchSettings`, everything that configures a run;
* :mod:`~mha_course.bench.steps` - one call of an implementation: forward or a training step;
* :mod:`~mha_course.bench.machine` - the matmul ceiling, the load, and whether they held still;
* :mod:`~mha_course.bench.memory` - peak memory in a fresh child process (POSIX only; imported
  only by a run that measures it);
* :mod:`~mha_course.bench.run` - the run itself;
* :mod:`~mha_course.bench.results` and :mod:`~mha_course.bench.plots` - results read back, tables,
  figures; :mod:`~mha_course.bench.files` - a run's files written (JSON, CSV, PNG);
* :mod:`~mha_course.bench.decode` - ``bench --decode`` (chapter 6): the time to generate one token
  with and without a key/value cache, at several lengths, in the same results format;
  :mod:`~mha_course.bench.decode_results` reads its results back;
* :mod:`~mha_course.bench.heads_map` - ``bench --heads-map`` (chapter 3): batched over stacked heads
  across sequence lengths x numbers of heads at one model width, with the processor's cache sizes;
  :mod:`~mha_course.bench.heads_map_results` reads its results back;
* :mod:`~mha_course.bench.tiled` - ``bench --tiled`` (chapter 7): peak memory and time of attention
  with the explicit scores, the tiled loop and the fused kernel, against the length;
* :mod:`~mha_course.bench.grouped` - ``bench --grouped`` (chapter 8): ``GroupedQueryAttention``
  on the fused kernel beside transformers' ``LlamaAttention`` and beside the fast path.
* :mod:`~mha_course.bench.latent` - ``bench --latent`` (chapter 10): one decoded token of latent
  attention, expanded and absorbed, against grouped-query attention with the same cache, up to 16k
  cached tokens.
* :mod:`~mha_course.bench.deltanet` - ``bench --deltanet`` (chapter 12): a prompt through the gated
  delta rule (chunked and recurrent) and softmax attention up to 16k tokens, and one decoded token
  with a key/value cache against Gated DeltaNet's fixed state;
* :mod:`~mha_course.bench.window` - ``bench --window`` (chapter 11): time and peak memory of attention
  under a sliding window, the tiled loop against the fused kernel given the mask, at 8k and 16k tokens.

The implementations themselves, and how to add one, are in :mod:`mha_course.implementations`.
Importing this package, and reading results, works on any operating system.
"""

from ..implementations import IMPLEMENTATIONS, Implementation, build_implementations
from .decode import decode_steps, run_decode_benchmark
from .deltanet import (DELTANET_CONFIGS, DeltaNetSettings, crossing, deltanet_rows, deltanet_summary,
                       deltanet_tables, run_deltanet_benchmark)
from .decode_results import DECODE_IMPLEMENTATIONS, DECODE_MODE, decode_rows, decode_summary, decode_table
from .files import write_results
from .grouped import (GROUPED_CONFIGS, GROUPED_IMPLEMENTATIONS, GroupedSettings, grouped_pairs, grouped_summary,
                      grouped_table, run_grouped_benchmark)
from .heads_map import run_heads_map
from .heads_map_results import (HEADS_MAP, HEADS_MAP_IMPLEMENTATIONS, heads_map_cells, heads_map_summary,
                                heads_map_table)
from .machine import MachineState, cache_sizes, matmul_ceiling, stability_warnings
from .latent import (LATENT_CONFIGS, LATENT_IMPLEMENTATIONS, LatentSettings, latent_rows, latent_summary,
                     latent_table, run_latent_benchmark)
from .plots import (plot_decode, plot_deltanet, plot_heads_map, plot_latent, plot_relative_times, plot_results,
                    plot_tiled, plot_window)
from .results import (BASELINES, FORMAT_VERSION, add_ratios, compare_times, load_results, lookup, results_table,
                      select, summary)
from .run import run_benchmark
from .settings import BenchSettings, DecodeSettings, HeadsMapSettings
from .sizes import (ALL_CONFIGS, ALL_DECODE_CONFIGS, ALL_HEADS_MAP_CONFIGS, CONFIGS, DECODE_CONFIGS, HEADS_MAP_CONFIGS,
                    QUICK_CONFIGS, QUICK_DECODE_CONFIGS, QUICK_HEADS_MAP_CONFIGS, BenchConfig)
from .steps import MODE_LABELS, MODES, build_for, make_step
from .tiled import (TILED_CONFIGS, TILED_IMPLEMENTATIONS, TiledSettings, run_tiled_benchmark, tiled_rows,
                    tiled_summary, tiled_table)
from .window import (WINDOW_CONFIGS, WINDOWS, WindowSettings, run_window_benchmark, window_rows, window_summary,
                     window_table)

__all__ = [
    "IMPLEMENTATIONS", "Implementation", "build_implementations", "build_for", "make_step", "MODES", "MODE_LABELS",
    "BenchConfig", "CONFIGS", "QUICK_CONFIGS", "ALL_CONFIGS", "BenchSettings", "run_benchmark",
    "MachineState", "matmul_ceiling", "stability_warnings", "FORMAT_VERSION", "BASELINES", "add_ratios",
    "write_results", "load_results", "select", "lookup", "compare_times", "results_table", "summary",
    "plot_results", "plot_relative_times", "DecodeSettings", "DECODE_CONFIGS", "QUICK_DECODE_CONFIGS", "ALL_DECODE_CONFIGS",
    "DECODE_IMPLEMENTATIONS", "DECODE_MODE", "run_decode_benchmark", "decode_steps", "decode_rows", "decode_table",
    "decode_summary", "plot_decode", "HeadsMapSettings", "HEADS_MAP_CONFIGS", "QUICK_HEADS_MAP_CONFIGS",
    "ALL_HEADS_MAP_CONFIGS", "HEADS_MAP", "HEADS_MAP_IMPLEMENTATIONS", "run_heads_map", "heads_map_cells",
    "heads_map_table", "heads_map_summary", "plot_heads_map", "cache_sizes",
    "TiledSettings", "TILED_CONFIGS", "TILED_IMPLEMENTATIONS", "run_tiled_benchmark",
    "tiled_rows", "tiled_table", "tiled_summary", "plot_tiled",
    "GroupedSettings", "GROUPED_CONFIGS", "GROUPED_IMPLEMENTATIONS", "run_grouped_benchmark", "grouped_pairs",
    "grouped_table", "grouped_summary",
    "LatentSettings", "LATENT_CONFIGS", "LATENT_IMPLEMENTATIONS", "run_latent_benchmark", "latent_rows",
    "latent_table", "latent_summary", "plot_latent",
    "DeltaNetSettings", "DELTANET_CONFIGS", "run_deltanet_benchmark", "deltanet_rows", "deltanet_tables",
    "deltanet_summary", "crossing", "plot_deltanet",
    "WindowSettings", "WINDOW_CONFIGS", "WINDOWS", "run_window_benchmark", "window_rows", "window_table",
    "window_summary", "plot_window",
]
