"""Why didn't TLT pay on my cluster? A diagnosis from a run's own RL logs (veRL, OpenRLHF,
TRL, or a workbench run folder): each step's time split into its parts, the rollout's long
tail, the live batch against where SD stops paying, and what each remedy would buy, predicted
by the cluster simulator with its validated error (docs/diagnose.md)."""
from .diagnosis import Diagnosis, diagnose
from .figures import live_batch_figure, remedies_figure, step_split_figure
from .logs import FORMATS, StepLog, read_logs
from .report import write_diagnosis
from .run import check_inputs, diagnose_logs
from .sd_curve import read_sd_curve
from .validated import validated_errors

__all__ = ["FORMATS", "StepLog", "read_logs", "read_sd_curve", "Diagnosis", "diagnose",
           "diagnose_logs", "check_inputs", "write_diagnosis", "validated_errors",
           "step_split_figure", "live_batch_figure", "remedies_figure"]
