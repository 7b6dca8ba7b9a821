package deploytest

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestTheExampleAlertFiresOnEveryPlainQueueReason: deploy/monitoring's
// rule decodes as a PrometheusRule and alerts on napitapd's plain-queue
// counter without picking out reasons, so a reason added later is covered.
func TestTheExampleAlertFiresOnEveryPlainQueueReason(t *testing.T) {
	path := filepath.Join(repoRoot, "deploy", "monitoring", "plain-queues.yaml")
	var found bool
	for _, o := range manifestFiles(t) {
		r, ok := o.obj.(*PrometheusRule)
		if !ok || !strings.HasPrefix(o.source, rel(path)) {
			continue
		}
		for _, g := range r.Spec.Groups {
			for _, rule := range g.Rules {
				if !strings.Contains(rule.Expr, "napitapd_plain_queues_total") {
					continue
				}
				found = true
				if strings.Contains(rule.Expr, "reason=") || strings.Contains(rule.Expr, "reason!") {
					t.Errorf("%s: alert %s selects reasons (%s): every plain queue should alert", o, rule.Alert, rule.Expr)
				}
			}
		}
	}
	if !found {
		t.Errorf("%s: no rule on napitapd_plain_queues_total", rel(path))
	}
}
