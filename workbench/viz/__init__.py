"""Matplotlib figures of rollout timelines and task evaluations (object-oriented API), and the
ipywidgets explorers that redraw them from run folders and tables."""
from .prune_explorer import PruneExplorer
from .sd_whatif import SDWhatIf
from .speculative import acceptance_vs_batch, sd_time_breakdown, speedup_vs_batch
from .task import accuracy_by_bucket, length_distributions
from .timeline import active_batch, gantt, length_histogram, save_figure
from .timeline_explorer import TimelineExplorer

__all__ = ["gantt", "length_histogram", "active_batch", "save_figure", "length_distributions",
           "accuracy_by_bucket", "speedup_vs_batch", "acceptance_vs_batch", "sd_time_breakdown",
           "TimelineExplorer", "SDWhatIf", "PruneExplorer"]
