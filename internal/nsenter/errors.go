package nsenter

import "errors"

// ErrNotBack: the thread ran code inside another network namespace and could not
// return to its own. It is never unlocked, so Go ends it with its goroutine and no
// other goroutine runs in that namespace by mistake.
var ErrNotBack = errors.New("nsenter: the thread could not return to its own network namespace (retired)")
