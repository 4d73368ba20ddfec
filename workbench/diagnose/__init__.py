"""Why didn't TLT pay on my cluster? A diagnosis from a run's own RL logs (veRL, OpenRLHF,
TRL, or a workbench run folder): each step's time split into its parts, the rollout's long
tail, the live batch against where SD stops paying, and what each remedy would buy, predicted
by the cluster simulator with its validated error (docs/diagnose.md)."""
