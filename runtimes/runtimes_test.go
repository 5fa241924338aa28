package runtimes

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestPythonAgentEmbedded(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("python", PythonAgentName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, PythonAgent) {
		t.Fatal("PythonAgent differs from python/torpor_agent.py")
	}
}
