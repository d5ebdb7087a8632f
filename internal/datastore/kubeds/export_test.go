package kubeds

// ObjectName is the object name and resource of key (for the tests' audit of the
// key mapping).
func ObjectName(key string) (name, resource string, err error) {
	r, err := parseKey(key)
	if err != nil {
		return "", "", err
	}
	return r.name, r.kind.gvr.Resource, nil
}
