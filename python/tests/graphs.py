"""Graphs the LangGraph tests run (pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

import operator
import random
import time
from typing import Annotated, Optional, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
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


def _record(effects: Optional[str], line: str) -> None:
    """Appends one line to the effects file (outside the store), if there is one."""
    if effects is not None:
        with open(effects, "a") as file:
            file.write(line + "\n")


def build_travel_agent(thread_id: str, effects: Optional[str] = None, pause: float = 0.0):  # type: ignore[no-untyped-def]
    """An agent graph: a fake LLM that calls tools (``ToolNode``) until it has a plan, an
    ``interrupt()`` for a human's approval, then a booking tool. Every node and tool appends
    ``run <thread_id> <output>`` to ``effects`` before it returns ``<output>``, the content of
    the one message it adds, which is unique within a thread."""

    def effect(output: str) -> str:
        if pause:
            time.sleep(random.random() * pause)
        _record(effects, f"run {thread_id} {output}")
        return output

    @tool
    def search_flights(city: str) -> str:
        """Flights to a city."""
        return effect(f"flights to {city}: LH123")

    @tool
    def search_hotels(city: str) -> str:
        """Hotels in a city."""
        return effect(f"hotels in {city}: Adlon")

    @tool
    def book(flight: str, hotel: str) -> str:
        """Books a flight and a hotel."""
        return effect(f"booked {flight} and {hotel}")

    script = [
        ("search_flights", {"city": "Berlin"}),
        ("search_hotels", {"city": "Berlin"}),
        (None, {}),
        ("book", {"flight": "LH123", "hotel": "Adlon"}),
        (None, {}),
    ]

    def llm(state: MessagesState) -> dict:
        turn = sum(1 for message in state["messages"] if isinstance(message, AIMessage))
        name, arguments = script[turn]
        content = effect(f"llm turn {turn}")
        calls = [{"id": f"call-{turn}", "name": name, "args": arguments}] if name else []
        return {"messages": [AIMessage(content=content, tool_calls=calls)]}

    def approval(state: MessagesState) -> dict:
        decision = interrupt({"question": "book the plan?"})
        return {"messages": [HumanMessage(content=effect(f"human said {decision}"))]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tools"
        approved = any(isinstance(message, HumanMessage) and message.content.startswith("human said")
                       for message in state["messages"])
        return END if approved else "approval"

    graph = StateGraph(MessagesState)
    graph.add_node("llm", llm)
    graph.add_node("tools", ToolNode([search_flights, search_hotels, book]))
    graph.add_node("approval", approval)
    graph.add_edge(START, "llm")
    graph.add_conditional_edges("llm", route, ["tools", "approval", END])
    graph.add_edge("tools", "llm")
    graph.add_edge("approval", "llm")
    return graph
