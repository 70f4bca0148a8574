"""The Dockerfile, the chart and pyproject.toml agree on the Ray and Python versions of the image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]


def dockerfile_args() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.MULTILINE))


def test_the_image_is_built_from_the_pinned_ray_and_python() -> None:
    args = dockerfile_args()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    ray = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "ray")
    python = re.fullmatch(r"py3(\d+)", args["PYTHON"])
    assert python, args["PYTHON"]
    assert args["RAY_VERSION"] in ray.specifier, (args["RAY_VERSION"], str(ray.specifier))
    assert f"3.{python.group(1)}" in SpecifierSet(project["requires-python"])
    values = yaml.safe_load((ROOT / "helm/fairlane/values.yaml").read_text(encoding="utf-8"))
    assert values["ray"]["version"] == args["RAY_VERSION"]
    chart = yaml.safe_load((ROOT / "helm/fairlane/Chart.yaml").read_text(encoding="utf-8"))
    readme = (ROOT / "helm/fairlane/README.md").read_text(encoding="utf-8")
    built = f"docker build -t {values['image']['repository']}:{chart['appVersion']} ."
    assert built in readme and built in (ROOT / "Dockerfile").read_text(encoding="utf-8"), built


def test_the_image_copies_every_package_the_project_installs() -> None:
    """A package added to pyproject.toml but not copied into the image installs nothing there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY \S+ (\w+) \1$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE))
    assert packages <= copied, sorted(packages - copied)
