package fleet

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestAPIErrForbidden: a refusal is ErrForbidden whether it comes as the API's status
// (a list) or only as the failed upgrade's text (an exec over SPDY), and keeps the
// API's message as it was.
func TestAPIErrForbidden(t *testing.T) {
	status := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "nobody" cannot list resource "pods"`))
	upgrade := errors.New(`unable to upgrade connection: pods "ipledgerd-x" is forbidden: User "viewer" cannot create resource "pods/exec" in API group "" in the namespace "ipledger"`)
	for _, err := range []error{status, upgrade} {
		got := apiErr(err)
		if !errors.Is(got, ErrForbidden) || got.Error() != err.Error() {
			t.Errorf("apiErr(%v) = %v, ErrForbidden %v", err, got, errors.Is(got, ErrForbidden))
		}
	}
	if other := errors.New("connection refused"); errors.Is(apiErr(other), ErrForbidden) {
		t.Errorf("connection refused taken for forbidden")
	}
}
