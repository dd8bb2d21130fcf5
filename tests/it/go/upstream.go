// A Go MCP-style upstream for tests/it/differentials.rs: it decodes each
// POST body with encoding/json into structs, as Go MCP servers do (names
// matched ignoring letter case under Unicode folding, the last duplicate
// winning), and answers with what it would run (method, tool, and a file tool's
// path and kind). GET /ran lists every tool
// it ran. It prints its address on stdout, then serves until killed.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
)

type params struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// The arguments of a file tool, decoded as a Go tool handler would.
type fileArgs struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
}

type request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  params          `json:"params"`
}

func main() {
	var mu sync.Mutex
	ran := []map[string]any{}
	mux := http.NewServeMux()
	mux.HandleFunc("/ran", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ran)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req request
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var args fileArgs
		if len(req.Params.Arguments) > 0 {
			json.Unmarshal(req.Params.Arguments, &args)
		}
		did := map[string]any{"method": req.Method, "tool": req.Params.Name, "path": args.Path, "kind": args.Kind}
		if req.Method == "tools/call" {
			mu.Lock()
			ran = append(ran, did)
			mu.Unlock()
		}
		id := req.ID
		if id == nil {
			id = json.RawMessage("null")
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id, "result": did})
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Addr().String())
	os.Stdout.Sync()
	http.Serve(l, mux)
}
