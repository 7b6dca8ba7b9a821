package deploytest

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Types of the custom resources in the manifests. They hold only the fields
// these manifests may use, with the names of the real APIs, so that strict
// decoding rejects both a misspelling and a field nobody meant here.

// NetworkAttachmentDefinition is k8s.cni.cncf.io/v1's (Multus).
type NetworkAttachmentDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Config string `json:"config"`
	} `json:"spec"`
}

// NetworkSelection is an element of the k8s.v1.cni.cncf.io/networks
// annotation, as Multus reads it.
type NetworkSelection struct {
	Name               string                     `json:"name"`
	Namespace          string                     `json:"namespace,omitempty"`
	IPs                []string                   `json:"ips,omitempty"`
	MAC                string                     `json:"mac,omitempty"`
	InfinibandGUID     string                     `json:"infiniband-guid,omitempty"`
	Interface          string                     `json:"interface,omitempty"`
	PortMappings       json.RawMessage            `json:"portMappings,omitempty"`
	Bandwidth          json.RawMessage            `json:"bandwidth,omitempty"`
	CNIArgs            map[string]json.RawMessage `json:"cni-args,omitempty"`
	DefaultRoute       []string                   `json:"default-route,omitempty"`
	IPAMClaimReference string                     `json:"ipam-claim-reference,omitempty"`
}

// confList is a CNI network configuration list (spec 1.1).
type confList struct {
	CNIVersion             string            `json:"cniVersion"`
	CNIVersions            []string          `json:"cniVersions,omitempty"`
	Name                   string            `json:"name"`
	DisableCheck           bool              `json:"disableCheck,omitempty"`
	DisableGC              bool              `json:"disableGC,omitempty"`
	LoadOnlyInlinedPlugins bool              `json:"loadOnlyInlinedPlugins,omitempty"`
	Plugins                []json.RawMessage `json:"plugins"`
}

// PrometheusRule is monitoring.coreos.com/v1's (Prometheus Operator), as
// deploy/monitoring's example alert uses it.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}
