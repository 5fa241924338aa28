// Package runtimes embeds the in-sandbox language agents so the torpor
// binary can write them out at start-up and needs no separate install. Each
// agent is tiny, dependency-free and speaks the protocol of
// internal/agentproto (docs/agent-protocol.md); this package holds only the
// files, not the logic that starts them.
package runtimes

import _ "embed"

// PythonAgent is runtimes/python/torpor_agent.py. Run it as
// `python3 -S torpor_agent.py` with the agent socket on fd 3 and
// TORPOR_AGENT_FD=3 in the environment.
//
//go:embed python/torpor_agent.py
var PythonAgent []byte

// PythonAgentName is the file name to write PythonAgent under; the agent
// keeps its own directory off the handler's module path.
const PythonAgentName = "torpor_agent.py"
