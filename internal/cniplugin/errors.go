package cniplugin

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Error is a CNI error: what a plugin writes to stdout when a call fails.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

// The spec's well-known error codes (CNI spec, "Error"); plugins add their own from
// 100.
const (
	ErrIncompatibleCNIVersion      uint = 1
	ErrUnsupportedField            uint = 2
	ErrUnknownContainer            uint = 3
	ErrInvalidEnvironmentVariables uint = 4
	ErrIOFailure                   uint = 5
	ErrDecodingFailure             uint = 6
	ErrInvalidNetworkConfig        uint = 7
	ErrInvalidNetNS                uint = 8
	ErrTryAgainLater               uint = 11
	ErrPluginNotAvailable          uint = 50
	ErrLimitedConnectivity         uint = 51
	ErrInternal                    uint = 999
)

// NewError returns an Error.
func NewError(code uint, msg, details string) *Error {
	return &Error{Code: code, Msg: msg, Details: details}
}

// Error is the message, then the details after "; ".
func (e *Error) Error() string {
	if e.Details != "" {
		return e.Msg + "; " + e.Details
	}
	return e.Msg
}

// JSON is the error as the library prints it (indented by four spaces, no trailing
// newline).
func (e *Error) JSON() []byte {
	var b bytes.Buffer
	b.WriteString("{\n    \"code\": ")
	b.WriteString(strconv.FormatUint(uint64(e.Code), 10))
	b.WriteString(",\n    \"msg\": ")
	writeStr(&b, e.Msg)
	if e.Details != "" {
		b.WriteString(",\n    \"details\": ")
		writeStr(&b, e.Details)
	}
	b.WriteString("\n}")
	return b.Bytes()
}

var _ json.Marshaler = (*Error)(nil)

// MarshalJSON is the compact form of JSON.
func (e *Error) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, e.JSON()); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
