"""The ReAct engine: chat-model interface, tools, and the loop. No I/O of its own."""
