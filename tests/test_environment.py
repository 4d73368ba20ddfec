"""The conda environment, the package metadata, CI and the README agree."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[test]" in pip  # the package with what its tests need, as the README's command
    assert sorted(p for p in pip if p != "-e .[test]") == sorted(deps)


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)\n```", readme, re.S)
    test_cmd = next(c.strip() for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()
    main_cmd = next(c.strip() for c in commands if "pipeline run pipelines/quickstart.yaml" in c)
    assert main_cmd.startswith("python3 -m venv")
