package routes

import "errors"

// ErrInvalidRoute: a desired route that cannot be a route (invalid
// destination, a unicast route without a next hop of its family, an unknown
// type, or a destination asked twice).
var ErrInvalidRoute = errors.New("invalid route")

// ErrWatchClosed: the kernel's route events stopped without an error said.
var ErrWatchClosed = errors.New("route event subscription closed")
