package ledger

import "github.com/ipledger/ipledger/internal/jsonlite"

// The JSON of the types that both the agent's wire messages (internal/api) and the
// stored records (internal/store) carry, written without reflection as json.Marshal
// writes them (their tests compare every field with encoding/json).

// AppendJSON writes k as json.Marshal does.
func (k Key) AppendJSON(e *jsonlite.Encoder) {
	f := true
	e.Raw("{")
	e.StrField(&f, "network", k.Network, false)
	e.StrField(&f, "containerID", k.ContainerID, false)
	e.StrField(&f, "ifname", k.IfName, false)
	e.Raw("}")
}

// AppendJSON writes p as json.Marshal does.
func (p Pod) AppendJSON(e *jsonlite.Encoder) {
	f := true
	e.Raw("{")
	e.StrField(&f, "namespace", p.Namespace, true)
	e.StrField(&f, "name", p.Name, true)
	e.StrField(&f, "uid", p.UID, true)
	e.StrField(&f, "infraContainerID", p.InfraContainerID, true)
	e.Raw("}")
}

// AppendJSON writes n as json.Marshal does.
func (n NetNS) AppendJSON(e *jsonlite.Encoder) {
	f := true
	e.Raw("{")
	e.StrField(&f, "path", n.Path, true)
	e.UintField(&f, "dev", n.Dev, true)
	e.UintField(&f, "ino", n.Ino, true)
	e.Raw("}")
}
