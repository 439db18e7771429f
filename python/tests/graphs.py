"""Graphs the LangGraph tests run (pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    approved: bool


def build_approval(side_effects: list[str]):  # type: ignore[no-untyped-def]
    def plan(state: State) -> dict:
        side_effects.append("plan")
        return {"messages": ["plan: book flight"]}

    def approve(state: State) -> dict:
        decision = interrupt({"question": "book it?"})
        side_effects.append(f"approve:{decision}")
        return {"approved": decision == "yes", "messages": [f"human said {decision}"]}

    def book(state: State) -> dict:
        side_effects.append("book")
        return {"messages": ["booked" if state["approved"] else "cancelled"]}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("approve", approve)
    graph.add_node("book", book)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "approve")
    graph.add_edge("approve", "book")
    graph.add_edge("book", END)
    return graph
