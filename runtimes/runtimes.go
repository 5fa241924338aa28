// Package runtimes embeds the in-sandbox language agents so the torpor
// binary can write them out at start-up and needs no separate install. Each
// agent is tiny, dependency-free and speaks the protocol of
// internal/agentproto (docs/agent-protocol.md). This package holds the
// files and how to launch them; starting, sandboxing and killing processes
// belong to the worker.
package runtimes

import _ "embed"

// PythonAgent is runtimes/python/torpor_agent.py.
//
//go:embed python/torpor_agent.py
var PythonAgent []byte

// PythonAgentName is the file name to write PythonAgent under: the
// bootstrap imports it as module torpor_agent.
const PythonAgentName = "torpor_agent.py"

// PythonBootstrap is the -c program that starts the Python agent written
// to the directory given as the next argument:
//
//	python3 -S -c runtimes.PythonBootstrap DIR
//
// with the agent socket on fd 3 and TORPOR_AGENT_FD=3. Importing the agent
// (rather than running it as a script) lets Python load its bytecode from
// DIR/__pycache__; compiling the file costs ~5 ms on every start otherwise.
// Populate the cache when writing the file out (python3 -m py_compile
// DIR/torpor_agent.py, with the interpreter the instances run) or leave DIR
// writable for the first start. -S skips site-packages: function code and
// its dependencies live in the code directory, as on Lambda.
const PythonBootstrap = "import sys;sys.path.insert(0,sys.argv[1]);import torpor_agent;torpor_agent.main()"
