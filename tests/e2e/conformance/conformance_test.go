// The upstream Gateway API conformance suite, unmodified: every option comes from its
// own command-line flags (gateway class, profiles, supported features, report), which
// ../cluster/run.sh passes.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
