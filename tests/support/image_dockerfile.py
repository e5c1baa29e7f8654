"""Reads a Dockerfile as far as the image checks need: its stages, what
each stage COPYs, and the `pip` commands its RUN instructions execute, with
ARG defaults substituted the way the build would see them.

Not a general parser: it knows the instructions and pip options these
Dockerfiles use and raises on a pip option it does not know, so a new one is
taught here rather than silently misread.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# pip options that take a value (long and short spellings), the rest are flags.
_VALUED = {
    "-c": "--constraint", "--constraint": "--constraint",
    "-w": "--wheel-dir", "--wheel-dir": "--wheel-dir",
    "-f": "--find-links", "--find-links": "--find-links",
    "-i": "--index-url", "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "-r": "--requirement", "--requirement": "--requirement",
    "--only-binary": "--only-binary", "--no-binary": "--no-binary",
}
_FLAGS = {"--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "-q", "--quiet", "-U", "--upgrade"}
_SHELL_SEPARATORS = {"&&", "||", ";", "|", "{", "}", "(", ")"}


@dataclass(frozen=True, slots=True)
class PipCommand:
    subcommand: str  # "install" or "wheel"
    options: dict[str, tuple[str, ...]]  # canonical long option -> its values ("" for a flag)
    requirements: tuple[str, ...]  # positional arguments: paths, wheel files or requirement strings

    def has(self, option: str) -> bool:
        return option in self.options

    def value(self, option: str) -> str:
        values = self.options.get(option, ())
        if len(values) != 1:
            raise ValueError(f"pip {self.subcommand}: expected one {option}, found {list(values)}")
        return values[0]


@dataclass(slots=True)
class Stage:
    base: str  # the FROM reference, ARGs substituted
    name: str | None
    copies: list[tuple[str, str]] = field(default_factory=list)  # (source, destination) from the context
    pip: list[PipCommand] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)  # the --mount= specs of its RUN instructions


@dataclass(frozen=True, slots=True)
class Dockerfile:
    path: Path
    args: dict[str, str]  # ARG name -> default
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"{self.path.name} has no stage named {name!r}")

    @property
    def runtime(self) -> Stage:
        """The last stage: what the image is."""
        return self.stages[-1]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction, continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    if current:
        joined.append(current)
    result = []
    for instruction in joined:
        keyword, _, rest = instruction.strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def _substitute(value: str, args: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args:
            raise ValueError(f"${name} has no ARG default")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, value)


def _pip_command(tokens: list[str]) -> PipCommand:
    subcommand, options, requirements = tokens[0], {}, []
    rest = iter(tokens[1:])
    for token in rest:
        option, equals, inline = token.partition("=")
        if token.startswith("-") and (option in _VALUED):
            value = inline if equals else next(rest)
            options.setdefault(_VALUED[option], ())
            options[_VALUED[option]] += (value,)
        elif token.startswith("-"):
            if token not in _FLAGS:
                raise ValueError(f"unknown pip option {token!r}: teach tests/support/image_dockerfile.py")
            options[token] = ("",)
        else:
            requirements.append(token)
    return PipCommand(subcommand, options, tuple(requirements))


def _shell_pip_commands(script: str, args: dict[str, str]) -> list[PipCommand]:
    """The `pip install|wheel` commands of a RUN's shell script, in order."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in [*lexer, "&&"]:
        if token in _SHELL_SEPARATORS:
            if current and current[0] in ("pip", "pip3") and current[1:2] in (["install"], ["wheel"]):
                commands.append(_pip_command([_substitute(t, args) for t in current[1:]]))
            current = []
        else:
            current.append(token)
    return commands


def parse(path: Path) -> Dockerfile:
    instructions = _instructions(path.read_text())
    args: dict[str, str] = {}
    for keyword, rest in instructions:
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            if args.setdefault(name, default) != default:
                raise ValueError(f"{path.name}: ARG {name} has two defaults")
    stages: list[Stage] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=_substitute(words[0], args), name=name))
        elif keyword == "COPY" and stages:
            words = [w for w in rest.split() if not w.startswith("--")]
            if not any(w.startswith("--from") for w in rest.split()):
                *sources, destination = words
                stages[-1].copies.extend((source, destination) for source in sources)
        elif keyword == "RUN" and stages:
            script = rest
            while script.startswith("--mount="):
                mount, _, script = script.partition(" ")
                stages[-1].mounts.append(mount.removeprefix("--mount="))
            stages[-1].pip.extend(_shell_pip_commands(script, args))
    return Dockerfile(path=path, args=args, stages=tuple(stages))
