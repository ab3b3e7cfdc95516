"""A regression's release history as version specifier sets (PEP 440, `packaging`).

`Releases(">=2.6.0,<2.16.0")` is one range; a bug that a patch release fixed and the next
minor lost again is a union of ranges, written with `||` between specifier sets:
`Releases("<2.16.1 || ==2.17.0")`. Roles, the sweep and the reports all read this one value.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

UNION = "||"


@dataclass(frozen=True)
class Releases:
    text: str

    def __post_init__(self) -> None:
        try:
            self.sets  # noqa: B018 - validates the text once, at declaration
        except InvalidSpecifier as exc:
            raise ValueError(f"bad release range {self.text!r}: {exc}") from None

    @property
    def sets(self) -> tuple[SpecifierSet, ...]:
        return tuple(SpecifierSet(part.strip()) for part in self.text.split(UNION))

    def __str__(self) -> str:
        return f" {UNION} ".join(part.strip().replace(" ", "") or "any" for part in self.text.split(UNION))

    def contains(self, version: Version) -> bool:
        return any(s.contains(version, prereleases=True) for s in self.sets)

    def settles(self, version: Version) -> bool:
        """Whether the version number alone tells if `version` is in these releases. A
        development or pre-release number (`2.16.0.dev0`: any commit after the 2.15 releases
        on the way to 2.16.0) cannot, when a bound of the ranges falls after the previous minor
        release and up to its own release: the change may be before or after that commit."""
        if not version.is_prerelease:
            return True
        major, minor, *_ = (*version.release, 0, 0)
        previous = Version(f"{major}.{minor - 1}") if minor > 0 else Version(f"{max(major - 1, 0)}")
        own = Version(version.base_version)
        return not any(previous < bound <= own for bound in self.bounds())

    def bounds(self) -> list[Version]:
        """Every version a range starts or ends at."""
        return [Version(s.version) for specifiers in self.sets for s in specifiers if "*" not in s.version]

    def lower_bound(self) -> Version | None:
        """The lowest release any range starts from; None when some range has no lower bound."""
        bounds = [_bound(s, (">=", ">", "==", "~=")) for s in self.sets]
        return None if any(b is None for b in bounds) else min(b for b in bounds if b is not None)

    def first_fixed(self) -> Version | None:
        """The upper bound of the lowest range: the first release after it that is not affected."""
        lowest = min(self.sets, key=lambda s: _bound(s, (">=", ">", "==", "~=")) or Version("0"))
        return _bound(lowest, ("<", "<="))

    def predates(self, version: Version) -> bool:
        bound = self.lower_bound()
        return bound is not None and version < bound and not self.contains(version)

    def observed_ranges(self, releases: list[str]) -> list[str]:
        """The runs of consecutive releases in `releases` (oldest first) that this set contains."""
        return ranges_of([r for r in releases if self.contains(Version(r))], releases)


def _bound(specifiers: SpecifierSet, operators: tuple[str, ...]) -> Version | None:
    found = [Version(s.version) for s in specifiers if s.operator in operators and "*" not in s.version]
    return min(found) if found else None


def ranges_of(chosen: list[str], releases: list[str]) -> list[str]:
    """`chosen` (a subset of `releases`, both oldest first) as runs of consecutive releases,
    each "A..B" (or "A" alone)."""
    runs: list[list[str]] = []
    previous = None
    for release in releases:
        if release in chosen:
            if previous is not None and previous in chosen and runs:
                runs[-1].append(release)
            else:
                runs.append([release])
        previous = release
    return [run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs]
