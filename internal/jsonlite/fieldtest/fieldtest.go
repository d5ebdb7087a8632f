// Package fieldtest helps the tests of hand-written JSON encoders (internal/api,
// internal/store) prove that no field of a struct is forgotten: Fill sets every field,
// and the test compares the encoder's bytes with json.Marshal's.
package fieldtest

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// Fill sets every field of v (a pointer) to a non-zero value that encoding/json writes
// plainly, so that an encoder that forgets a field (one added to the struct after the
// encoder was written) differs from json.Marshal.
func Fill(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		Fill(t, v.Elem())
	case reflect.Struct:
		switch v.Type() {
		case reflect.TypeFor[time.Time]():
			v.Set(reflect.ValueOf(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)))
			return
		case reflect.TypeFor[netip.Addr]():
			v.Set(reflect.ValueOf(netip.MustParseAddr("10.1.2.3")))
			return
		case reflect.TypeFor[netip.Prefix]():
			v.Set(reflect.ValueOf(netip.MustParsePrefix("10.1.2.3/32")))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				Fill(t, v.Field(i))
			}
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		Fill(t, s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		Fill(t, k)
		Fill(t, e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	default:
		t.Fatalf("fill: %s not handled", v.Type())
	}
}
