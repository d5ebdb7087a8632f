package choice

import "errors"

// ErrBadAnnotation: an ipledger.io annotation does not parse. The message names the
// annotation, the object it is on, and the form it must take.
var ErrBadAnnotation = errors.New("bad ipledger.io annotation")
