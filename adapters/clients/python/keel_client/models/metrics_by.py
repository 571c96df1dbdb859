from enum import StrEnum


class MetricsBy(StrEnum):
    MODEL = "model"
    OPERATION = "operation"
    POLICY = "policy"
    PROMPT = "prompt"
    RELEASE = "release"
    TOOL = "tool"

    def __str__(self) -> str:
        return str(self.value)
