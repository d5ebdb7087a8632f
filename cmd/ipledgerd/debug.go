package main

import (
	"net/http"
	"net/http/pprof"
)

// debugHandler is the --debug-addr listener's: Go's profiler only, on a mux of
// its own (net/http/pprof's init registers on http.DefaultServeMux, which no
// listener of the agent serves).
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
