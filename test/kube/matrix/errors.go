package matrix

import "errors"

// ErrNoMarkers: the document lacks the Begin and End lines the table goes
// between.
var ErrNoMarkers = errors.New("matrix: the document has no matrix markers")
