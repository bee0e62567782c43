"""PLACEHOLDER until the policy module lands (being written now)."""

from __future__ import annotations

from dataclasses import dataclass


class PolicyViolation(Exception):
    def __init__(self, rule: str, line: int | None, message: str) -> None:
        super().__init__(message)
        self.rule, self.line, self.message = rule, line, message


@dataclass(frozen=True)
class CodePolicy:
    deny_imports: tuple[str, ...] = ()
    deny_calls: tuple[str, ...] = ()
    deny_shell: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.deny_imports or self.deny_calls or self.deny_shell)

    @classmethod
    def from_lists(cls, deny_imports: list[str], deny_calls: list[str], deny_shell: bool) -> "CodePolicy":
        return cls(tuple(deny_imports), tuple(deny_calls), deny_shell)

    def check(self, code: str) -> None:
        return None
