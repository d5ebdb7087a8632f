package ledger

import "errors"

// Sentinel errors of the ledger. They are wrapped with %w and a message naming the
// network, attachment or field; check them with errors.Is. The plugin maps them to CNI
// error codes at its boundary.
var (
	// ErrPoolExhausted: no address of a range set is free (or all free ones are still
	// inside their reuse delay).
	ErrPoolExhausted = errors.New("pool exhausted")
	// ErrPoolConflict: a network is configured with ranges that differ from the ranges
	// its pool was created with.
	ErrPoolConflict = errors.New("pool ranges conflict")
	// ErrUnknownNetwork: the network has no pool yet.
	ErrUnknownNetwork = errors.New("unknown network")
	// ErrInvalidAttachment: a field of a request (network name, container ID, ifname,
	// pod namespace, name or UID, netns path, release detail) is empty where it is
	// required, longer than its limit, or holds bytes that are not allowed. The message
	// names the field and the limit.
	ErrInvalidAttachment = errors.New("invalid attachment")
	// ErrNotFound: no lease for that attachment.
	ErrNotFound = errors.New("lease not found")
	// ErrStore: the durable store failed (I/O error, disk full); nothing was changed.
	ErrStore = errors.New("state store failed")
	// ErrStateUnknown: a commit failed and the ledger could not read its books back
	// from the store; it refuses every change until the process is restarted (the
	// agent exits on it, its supervisor starts it again). Wrapped with ErrStore.
	ErrStateUnknown = errors.New("ledger state unknown after a failed commit")
	// ErrCorrupt: the state file cannot be read as a ledger.
	ErrCorrupt = errors.New("state file corrupt")
	// ErrNoBlockCapacity: an allocation in a cluster-scoped pool found no address it
	// may hand out in the blocks the node owns and can prove (wrapped together with
	// ErrPoolExhausted, in a *BlockCapacityError naming the range set): the block
	// manager claims another block for that range set and retries.
	ErrNoBlockCapacity = errors.New("no free address in the node's blocks")
	// ErrBlockInUse: a block cannot be removed while a lease holds one of its addresses.
	ErrBlockInUse = errors.New("block in use")
	// ErrUnknownBlock: the pool has no such block (or it is not cluster-scoped), or
	// the block is not one of the pool's aligned blocks.
	ErrUnknownBlock = errors.New("unknown block")
	// ErrAddressUnavailable: an allocation asked for an address (AllocateRequest.Want)
	// that it cannot have: outside the pool, reserved, excluded, held by another
	// attachment, still in its reuse delay, or (cluster mode) in no block the node
	// owns. The message names the address and the reason; nothing was allocated.
	ErrAddressUnavailable = errors.New("requested address unavailable")
	// ErrBlockEpoch: a block operation named an epoch other than the block's.
	ErrBlockEpoch = errors.New("block epoch mismatch")
)
