"""`single_tool_call`: call `get_weather(city)` once and answer with what it returned."""

from __future__ import annotations

import json

from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import ToolError
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import tool

WEATHER = {
    "san francisco": "foggy, 16°C",
    "paris": "light rain, 12°C",
    "tokyo": "sunny, 24°C",
    "london": "overcast, 11°C",
    "sydney": "clear skies, 22°C",
    "cairo": "hot and dry, 35°C",
}


def weather_for(city: str) -> str:
    key = " ".join(city.strip().lower().split())
    if key not in WEATHER:
        known = ", ".join(c.title() for c in WEATHER)
        raise ToolError(f"no weather data for {city!r}; known cities: {known}")
    return WEATHER[key]


class SingleToolCall(Environment):
    """One tool, `get_weather(city)`, returning deterministic fake weather. Reward 1.0 when the model
    called it (for the task's city, when given) and its final answer contains the tool's output."""

    @tool
    async def get_weather(self, session: Session, city: str) -> str:
        """Get the current weather for a city."""
        del session
        return weather_for(city)

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        del session
        want = str(task.metadata.get("city", "")).strip().lower()
        outputs: list[str] = []
        for call in response.tool_calls:
            if call.name != "get_weather":
                continue
            try:
                city = str(json.loads(call.arguments_json).get("city", ""))
                result = weather_for(city)
            except (ValueError, RecursionError, AttributeError, ToolError):  # the model's JSON: anything
                continue
            if not want or city.strip().lower() == want:
                outputs.append(result)
        called = 1.0 if outputs else 0.0
        final = response.final_text
        used = next((o for o in outputs if o.lower() in final.lower()), "")
        answered = 1.0 if used else 0.0
        if not response.tool_calls:
            reason = "get_weather was not called"
        elif not outputs:
            reason = "no valid get_weather call" + (f" for {want!r}" if want else "")
        elif not answered:
            reason = "the answer does not contain the tool's output"
        else:
            reason = "called the tool and answered with its output"
        return VerifyResult(
            called * answered,
            {"called_tool": called, "answered_with_output": answered},
            used,
            {"reason": reason, "expected_output": outputs[0] if outputs else ""},
        )
