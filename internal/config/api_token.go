package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// APIToken is the secret callers of the HTTP API present.
type APIToken struct {
	Value string
	Path  string // the file it was read from or written to
	// Created reports that the file did not exist and was written now.
	Created bool
	// Mode is the file's permission bits; group or other bits mean people
	// other than the server's user may be able to read it.
	Mode fs.FileMode
}

// apiTokenBytes is the entropy of a generated token (hex-encoded on disk).
const apiTokenBytes = 32

// Bounds of a token given in a file, so it fits a Bearer header and the
// access key id of an AWS SigV4 Credential (where "/" and "," separate
// fields).
const (
	minAPITokenLen = 16
	maxAPITokenLen = 512
)

// LoadAPIToken reads the API token at path, creating the file with a fresh
// random token (mode 0600) when it does not exist. Surrounding whitespace in
// the file is ignored, so an editor's trailing newline does no harm.
func LoadAPIToken(path string) (APIToken, error) {
	t := APIToken{Path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createAPIToken(path); err != nil {
			return t, err
		}
		t.Created = true
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return t, fmt.Errorf("read API token %s: %w (fix its permissions, or pass --api-token-file)", path, err)
	}
	t.Value = strings.TrimSpace(string(b))
	if err := ValidateAPIToken(t.Value); err != nil {
		return t, fmt.Errorf("API token in %s: %w; or delete the file and restart to generate one", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return t, fmt.Errorf("stat API token %s: %w", path, err)
	}
	t.Mode = fi.Mode().Perm()
	return t, nil
}

// ValidateAPIToken checks that tok can travel as a Bearer token and as an
// AWS access key id.
func ValidateAPIToken(tok string) error {
	if len(tok) < minAPITokenLen || len(tok) > maxAPITokenLen {
		return fmt.Errorf("it has %d characters: use %d to %d", len(tok), minAPITokenLen, maxAPITokenLen)
	}
	for _, r := range tok {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~+=", r)
		if !ok {
			return fmt.Errorf("character %q is not allowed: use only A-Z a-z 0-9 - . _ ~ + =", r)
		}
	}
	return nil
}

// createAPIToken writes a fresh token to path atomically: it is written to
// a temporary file and linked into place, so a concurrent reader never sees
// a partial token, and a file created meanwhile by someone else wins.
func createAPIToken(path string) error {
	raw := make([]byte, apiTokenBytes)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails (Go ≥ 1.24)
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".api-token-*")
	if err != nil {
		return fmt.Errorf("create API token in %s: %w (create the directory, or pass --api-token-file)", dir, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	// CreateTemp makes the file 0600 already; Chmod states it.
	err = f.Chmod(0o600)
	if err == nil {
		// No trailing newline: a tool that reads the file verbatim would send
		// it as part of the token.
		_, err = f.WriteString(hex.EncodeToString(raw))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write API token %s: %w", tmp, err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create API token %s: %w", path, err)
	}
	return nil
}
