package api

// Hand-written JSON (package jsonlite) for the hot path of every CNI call: the
// plugin's ADD/DEL request and the agent's answer to it. A plugin is a new process per
// call, so encoding/json built its reflection caches for Request, Response, LeaseView
// and time.Time on every ADD: measured at about 0.3 ms of a cold plugin process
// (json.Marshal of a Request ~0.1 ms, json.Unmarshal of an ADD answer ~0.2 ms), the
// largest share of the plugin's own work. The agent paid the reflection on every
// request too.
//
// The encoders produce exactly json.Marshal's bytes and leave anything else (a string
// needing escapes, an unusual time, a response carrying leases, audit, history or pool)
// to json.Marshal; the decoders leave anything outside jsonlite's strict subset to
// json.Unmarshal. wire_test.go checks both against encoding/json, and
// wire_fields_test.go fails when a field added to these structs is not written here.

import (
	"encoding/json"

	"github.com/ipledger/ipledger/internal/jsonlite"
	"github.com/ipledger/ipledger/internal/pool"
)

// MarshalRequest is json.Marshal(req) without reflection for the usual requests.
func MarshalRequest(req Request) ([]byte, error) {
	if b, ok := appendRequest(make([]byte, 0, 256), &req); ok {
		return b, nil
	}
	return json.Marshal(req)
}

// MarshalResponse is json.Marshal(resp) without reflection for the answers to ADD,
// DEL, CHECK and errors.
func MarshalResponse(resp *Response) ([]byte, error) {
	if b, ok := appendResponse(make([]byte, 0, 320), resp); ok {
		return b, nil
	}
	return json.Marshal(resp)
}

// UnmarshalRequest is json.Unmarshal(data, req).
func UnmarshalRequest(data []byte, req *Request) error {
	var r Request
	if d := jsonlite.NewDecoder(data); decodeRequest(d, &r) && d.End() {
		*req = r
		return nil
	}
	return json.Unmarshal(data, req)
}

// UnmarshalResponse is json.Unmarshal(data, resp).
func UnmarshalResponse(data []byte, resp *Response) error {
	var r Response
	if d := jsonlite.NewDecoder(data); decodeResponse(d, &r) && d.End() {
		*resp = r
		return nil
	}
	return json.Unmarshal(data, resp)
}

func appendRequest(b []byte, r *Request) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	e.Raw(`{"version":`)
	e.Int(int64(r.Version))
	first := false
	e.StrField(&first, "op", r.Op, false)
	e.StrField(&first, "network", r.Network, true)
	e.StrField(&first, "containerID", r.ContainerID, true)
	e.StrField(&first, "ifname", r.IfName, true)
	if len(r.Ranges) > 0 {
		e.Field(&first, "ranges")
		pool.AppendRangeSets(&e, r.Ranges)
	}
	if r.BlockSize != 0 {
		e.Raw(`,"blockSize":`)
		e.Int(int64(r.BlockSize))
	}
	if len(r.Exclude) > 0 {
		e.Field(&first, "exclude")
		e.Strings(r.Exclude)
	}
	if r.Pod != (Pod{}) {
		e.Field(&first, "pod")
		appendPod(&e, r.Pod)
	}
	if r.NetNS != (NetNS{}) {
		e.Field(&first, "netns")
		appendNetNS(&e, r.NetNS)
	}
	if len(r.Valid) > 0 {
		e.Field(&first, "valid")
		e.Raw("[")
		for i, a := range r.Valid {
			if i > 0 {
				e.Raw(",")
			}
			f := true
			e.Raw("{")
			e.StrField(&f, "containerID", a.ContainerID, false)
			e.StrField(&f, "ifname", a.IfName, false)
			e.Raw("}")
		}
		e.Raw("]")
	}
	if len(r.IPs) > 0 {
		e.Field(&first, "ips")
		e.Strings(r.IPs)
	}
	e.StrField(&first, "ip", r.IP, true)
	e.StrField(&first, "detail", r.Detail, true)
	if r.ForceReadySandbox {
		e.Raw(`,"forceReadySandbox":true`)
	}
	if c := r.CNI; c != nil {
		e.Field(&first, "cni")
		f := true
		e.Raw("{")
		e.StrField(&f, "command", c.Command, false)
		e.StrField(&f, "containerID", c.ContainerID, true)
		e.StrField(&f, "netns", c.NetNS, true)
		e.StrField(&f, "ifname", c.IfName, true)
		e.StrField(&f, "args", c.Args, true)
		e.StrField(&f, "path", c.Path, true)
		e.StrField(&f, "netnsOverride", c.NetNSOverride, true)
		e.Field(&f, "stdin")
		e.Bytes(c.Stdin)
		if c.NetNSID != (NetNS{}) {
			e.Field(&f, "netnsID")
			appendNetNS(&e, c.NetNSID)
		}
		if c.SelfNetNS != (NetNS{}) {
			e.Field(&f, "selfNetNS")
			appendNetNS(&e, c.SelfNetNS)
		}
		e.Raw("}")
	}
	e.Raw("}")
	return e.B, e.OK
}

// appendPod writes p as json.Marshal does.
func appendPod(e *jsonlite.Encoder, p Pod) {
	f := true
	e.Raw("{")
	e.StrField(&f, "namespace", p.Namespace, true)
	e.StrField(&f, "name", p.Name, true)
	e.StrField(&f, "uid", p.UID, true)
	e.StrField(&f, "infraContainerID", p.InfraContainerID, true)
	e.Raw("}")
}

// appendNetNS writes n as json.Marshal does.
func appendNetNS(e *jsonlite.Encoder, n NetNS) {
	f := true
	e.Raw("{")
	e.StrField(&f, "path", n.Path, true)
	e.UintField(&f, "dev", n.Dev, true)
	e.UintField(&f, "ino", n.Ino, true)
	e.Raw("}")
}

func appendResponse(b []byte, r *Response) ([]byte, bool) {
	if r.Leases != nil || r.Audit != nil || r.History != nil || r.Pool != nil || r.Doctor != nil || r.Cluster != nil {
		return b, false
	}
	e := jsonlite.NewEncoder(b)
	e.Raw(`{"version":`)
	e.Int(int64(r.Version))
	first := false
	if r.Error != nil {
		e.Field(&first, "error")
		f := true
		e.Raw("{")
		e.StrField(&f, "code", r.Error.Code, false)
		e.StrField(&f, "msg", r.Error.Msg, false)
		e.Raw("}")
	}
	if v := r.Lease; v != nil {
		e.Field(&first, "lease")
		f := true
		e.Raw("{")
		e.StrField(&f, "network", v.Network, false)
		e.StrField(&f, "containerID", v.ContainerID, false)
		e.StrField(&f, "ifname", v.IfName, false)
		e.Field(&f, "ips")
		e.Strings(v.IPs)
		if len(v.Gateways) > 0 {
			e.Field(&f, "gateways")
			e.Strings(v.Gateways)
		}
		e.StrField(&f, "namespace", v.Namespace, true)
		e.StrField(&f, "name", v.Name, true)
		e.StrField(&f, "uid", v.UID, true)
		e.StrField(&f, "infraContainerID", v.Infra, true)
		e.StrField(&f, "netns", v.NetNS, true)
		e.StrField(&f, "netnsID", v.NetNSID, true)
		e.Field(&f, "created")
		e.Time(v.Created)
		e.StrField(&f, "state", v.State, false)
		e.StrField(&f, "why", v.Why, true)
		e.StrField(&f, "pool", v.Pool, true)
		e.StrField(&f, "sandbox", v.Sandbox, true)
		e.StrField(&f, "suspect", v.Suspect, true)
		e.StrField(&f, "verdict", v.Verdict, true)
		e.StrField(&f, "block", v.Block, true)
		if v.Lost {
			e.Raw(`,"lost":true`)
		}
		e.StrField(&f, "podPhase", v.PodPhase, true)
		e.StrField(&f, "podInAPI", v.PodInAPI, true)
		e.Raw("}")
	}
	e.Field(&first, "released")
	e.Int(int64(r.Released))
	if r.Existed {
		e.Raw(`,"existed":true`)
	}
	if c := r.CNI; c != nil {
		e.Raw(`,"cni":{"exit":`)
		e.Int(int64(c.Exit))
		e.Raw(`,"stdout":`)
		e.Bytes(c.Stdout)
		e.Raw(`,"stderr":`)
		e.Bytes(c.Stderr)
		e.Raw("}")
	}
	e.Raw("}")
	return e.B, e.OK
}

func decodeRanges(d *jsonlite.Decoder) ([]pool.RangeSet, bool) {
	sets := []pool.RangeSet{}
	ok := d.Array(func() bool {
		set := pool.RangeSet{}
		ok := d.Array(func() bool {
			var r pool.Range
			ok := d.Object(func(k string) bool {
				switch k {
				case "subnet":
					return d.Text(&r.Subnet)
				case "rangeStart":
					return d.Text(&r.RangeStart)
				case "rangeEnd":
					return d.Text(&r.RangeEnd)
				case "gateway":
					return d.Text(&r.Gateway)
				case "usePodCidr":
					var ok bool
					r.PodCIDR, ok = d.Int()
					return ok
				}
				return false
			})
			set = append(set, r)
			return ok
		})
		sets = append(sets, set)
		return ok
	})
	return sets, ok
}

// decodePod reads a Pod as json.Unmarshal does, within jsonlite's subset.
func decodePod(d *jsonlite.Decoder, p *Pod) bool {
	return d.Object(func(k string) bool {
		switch k {
		case "namespace":
			return d.SetStr(&p.Namespace)
		case "name":
			return d.SetStr(&p.Name)
		case "uid":
			return d.SetStr(&p.UID)
		case "infraContainerID":
			return d.SetStr(&p.InfraContainerID)
		}
		return false
	})
}

// decodeNetNS reads a NetNS as json.Unmarshal does, within jsonlite's subset.
func decodeNetNS(d *jsonlite.Decoder, n *NetNS) bool {
	return d.Object(func(k string) bool {
		var ok bool
		switch k {
		case "path":
			ok = d.SetStr(&n.Path)
		case "dev":
			n.Dev, ok = d.Uint()
		case "ino":
			n.Ino, ok = d.Uint()
		}
		return ok
	})
}

func decodeRequest(d *jsonlite.Decoder, r *Request) bool {
	return d.Object(func(k string) bool {
		var ok bool
		switch k {
		case "version":
			r.Version, ok = d.Int()
		case "op":
			ok = d.SetStr(&r.Op)
		case "network":
			ok = d.SetStr(&r.Network)
		case "containerID":
			ok = d.SetStr(&r.ContainerID)
		case "ifname":
			ok = d.SetStr(&r.IfName)
		case "ranges":
			r.Ranges, ok = decodeRanges(d)
		case "blockSize":
			r.BlockSize, ok = d.Int()
		case "exclude":
			r.Exclude, ok = d.Strings()
		case "pod":
			ok = decodePod(d, &r.Pod)
		case "netns":
			ok = decodeNetNS(d, &r.NetNS)
		case "valid":
			r.Valid = []Attachment{}
			ok = d.Array(func() bool {
				var a Attachment
				ok := d.Object(func(k string) bool {
					switch k {
					case "containerID":
						return d.SetStr(&a.ContainerID)
					case "ifname":
						return d.SetStr(&a.IfName)
					}
					return false
				})
				r.Valid = append(r.Valid, a)
				return ok
			})
		case "ips":
			r.IPs, ok = d.Strings()
		case "ip":
			ok = d.SetStr(&r.IP)
		case "detail":
			ok = d.SetStr(&r.Detail)
		case "cni":
			c := &CNICall{}
			r.CNI = c
			ok = d.Object(func(k string) bool {
				switch k {
				case "command":
					return d.SetStr(&c.Command)
				case "containerID":
					return d.SetStr(&c.ContainerID)
				case "netns":
					return d.SetStr(&c.NetNS)
				case "ifname":
					return d.SetStr(&c.IfName)
				case "args":
					return d.SetStr(&c.Args)
				case "path":
					return d.SetStr(&c.Path)
				case "netnsOverride":
					return d.SetStr(&c.NetNSOverride)
				case "stdin":
					var ok bool
					c.Stdin, ok = d.Bytes()
					return ok
				case "netnsID":
					return decodeNetNS(d, &c.NetNSID)
				case "selfNetNS":
					return decodeNetNS(d, &c.SelfNetNS)
				}
				return false
			})
		}
		return ok
	})
}

func decodeResponse(d *jsonlite.Decoder, r *Response) bool {
	return d.Object(func(k string) bool {
		var ok bool
		switch k {
		case "version":
			r.Version, ok = d.Int()
		case "error":
			r.Error = &Error{}
			ok = d.Object(func(k string) bool {
				switch k {
				case "code":
					return d.SetStr(&r.Error.Code)
				case "msg":
					return d.SetStr(&r.Error.Msg)
				}
				return false
			})
		case "lease":
			v := &LeaseView{}
			r.Lease = v
			ok = d.Object(func(k string) bool {
				var ok bool
				switch k {
				case "network":
					ok = d.SetStr(&v.Network)
				case "containerID":
					ok = d.SetStr(&v.ContainerID)
				case "ifname":
					ok = d.SetStr(&v.IfName)
				case "ips":
					v.IPs, ok = d.Strings()
				case "gateways":
					v.Gateways, ok = d.Strings()
				case "namespace":
					ok = d.SetStr(&v.Namespace)
				case "name":
					ok = d.SetStr(&v.Name)
				case "uid":
					ok = d.SetStr(&v.UID)
				case "infraContainerID":
					ok = d.SetStr(&v.Infra)
				case "netns":
					ok = d.SetStr(&v.NetNS)
				case "netnsID":
					ok = d.SetStr(&v.NetNSID)
				case "created":
					ok = d.Text(&v.Created)
				case "state":
					ok = d.SetStr(&v.State)
				case "why":
					ok = d.SetStr(&v.Why)
				case "pool":
					ok = d.SetStr(&v.Pool)
				case "sandbox":
					ok = d.SetStr(&v.Sandbox)
				case "suspect":
					ok = d.SetStr(&v.Suspect)
				case "verdict":
					ok = d.SetStr(&v.Verdict)
				case "block":
					ok = d.SetStr(&v.Block)
				case "lost":
					v.Lost, ok = d.Bool()
				case "podPhase":
					ok = d.SetStr(&v.PodPhase)
				case "podInAPI":
					ok = d.SetStr(&v.PodInAPI)
				}
				return ok
			})
		case "released":
			r.Released, ok = d.Int()
		case "existed":
			r.Existed, ok = d.Bool()
		case "cni":
			c := &CNIAnswer{}
			r.CNI = c
			ok = d.Object(func(k string) bool {
				var ok bool
				switch k {
				case "exit":
					c.Exit, ok = d.Int()
				case "stdout":
					c.Stdout, ok = d.Bytes()
				case "stderr":
					c.Stderr, ok = d.Bytes()
				}
				return ok
			})
		}
		return ok
	})
}
