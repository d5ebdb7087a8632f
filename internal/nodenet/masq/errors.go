package masq

import "errors"

// ErrNoTable: ipledger's masquerade table is not there.
var ErrNoTable = errors.New("no masquerade table")
