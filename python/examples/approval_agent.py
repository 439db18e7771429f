"""A travel agent that asks a human before it books, checkpointed by continuum.

A LangGraph ``StateGraph`` with a fake LLM (a script, so no network and no API key), tool
nodes that search and book, and an ``interrupt()`` for the approval. The first process runs
until the question and exits; the second reopens the store and resumes with the human's
answer, as an agent service does after a restart.

    pip install ./python langgraph
    python python/examples/approval_agent.py /tmp/approval-store          # asks, then stops
    python python/examples/approval_agent.py /tmp/approval-store --answer yes
    cargo run --release --example dump -- /tmp/approval-store run langgraph:trip-42
"""

from __future__ import annotations

import argparse

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from continuum.langgraph import ContinuumSaver

THREAD = {"configurable": {"thread_id": "trip-42"}}


@tool
def search_flights(city: str) -> str:
    """Flights to a city."""
    return f"LH123 to {city}, 09:40"


@tool
def book(flight: str) -> str:
    """Books a flight."""
    return f"booked {flight}, confirmation K7Q2"


def fake_llm(messages: list[BaseMessage]) -> AIMessage:
    """Stands in for a chat model: the next step of a fixed plan."""
    turn = sum(1 for message in messages if isinstance(message, AIMessage))
    if turn == 0:
        return AIMessage("Let me look for flights.", tool_calls=[{"id": "c1", "name": "search_flights", "args": {"city": "Berlin"}}])
    if turn == 1:
        return AIMessage("LH123 at 09:40 fits. Shall I book it?")
    if messages[-1].content == "yes":
        return AIMessage("Booking it.", tool_calls=[{"id": "c2", "name": "book", "args": {"flight": "LH123"}}])
    return AIMessage("Done." if turn == 3 else "All right, nothing booked.")


def agent(state: MessagesState) -> dict:
    return {"messages": [fake_llm(state["messages"])]}


def approval(state: MessagesState) -> dict:
    answer = interrupt({"question": state["messages"][-1].content})
    return {"messages": [HumanMessage(answer)]}


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return "tools"
    asked = any(isinstance(message, HumanMessage) and message.content in ("yes", "no") for message in state["messages"])
    return END if asked else "approval"


def build() -> StateGraph:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([search_flights, book]))
    graph.add_node("approval", approval)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", "approval", END])
    graph.add_edge("tools", "agent")
    graph.add_edge("approval", "agent")
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", help="the store's directory (created on first use)")
    parser.add_argument("--answer", choices=["yes", "no"], help="the human's answer to the pending question")
    arguments = parser.parse_args()
    with ContinuumSaver.from_path(arguments.store) as saver:
        graph = build().compile(checkpointer=saver)
        state = graph.get_state(THREAD)
        if not state.values:
            result = graph.invoke({"messages": [HumanMessage("Book me a flight to Berlin tomorrow morning.")]}, THREAD)
        elif state.interrupts and arguments.answer:
            result = graph.invoke(Command(resume=arguments.answer), THREAD)
        else:
            result = state.values
        for message in result["messages"]:
            print(f"{type(message).__name__:>12}: {message.content}")
        if "__interrupt__" in result or graph.get_state(THREAD).interrupts:
            print("waiting for approval: run again with --answer yes (or no)")
        checkpoints = list(saver.list(THREAD))
        print(f"{len(checkpoints)} checkpoints in {arguments.store}")


if __name__ == "__main__":
    main()
