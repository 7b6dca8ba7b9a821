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

// KubeVirt is kubevirt.io/v1's, as far as network binding plugins and
// seccomp profiles go.
type KubeVirt struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Configuration struct {
			Network struct {
				Binding map[string]InterfaceBindingPlugin `json:"binding,omitempty"`
			} `json:"network"`
			SeccompConfiguration *struct {
				VirtualMachineInstanceProfile *struct {
					CustomProfile *struct {
						LocalhostProfile *string `json:"localhostProfile,omitempty"`
						RuntimeDefault   bool    `json:"runtimeDefaultProfile,omitempty"`
					} `json:"customProfile,omitempty"`
				} `json:"virtualMachineInstanceProfile,omitempty"`
			} `json:"seccompConfiguration,omitempty"`
		} `json:"configuration"`
	} `json:"spec"`
}

type InterfaceBindingPlugin struct {
	SidecarImage                string          `json:"sidecarImage,omitempty"`
	NetworkAttachmentDefinition string          `json:"networkAttachmentDefinition,omitempty"`
	DomainAttachmentType        string          `json:"domainAttachmentType,omitempty"`
	Migration                   json.RawMessage `json:"migration,omitempty"`
	DownwardAPI                 string          `json:"downwardAPI,omitempty"`
	ComputeResourceOverhead     json.RawMessage `json:"computeResourceOverhead,omitempty"`
}

// VirtualMachineInstance is kubevirt.io/v1's, the parts a VM on a napitap
// network uses.
type VirtualMachineInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Domain struct {
			CPU *struct {
				Cores   uint32 `json:"cores,omitempty"`
				Sockets uint32 `json:"sockets,omitempty"`
				Threads uint32 `json:"threads,omitempty"`
			} `json:"cpu,omitempty"`
			Memory *struct {
				Guest string `json:"guest,omitempty"`
			} `json:"memory,omitempty"`
			Resources json.RawMessage `json:"resources,omitempty"`
			Devices   struct {
				NetworkInterfaceMultiQueue *bool `json:"networkInterfaceMultiqueue,omitempty"`
				Disks                      []struct {
					Name string `json:"name"`
					Disk *struct {
						Bus string `json:"bus,omitempty"`
					} `json:"disk,omitempty"`
				} `json:"disks,omitempty"`
				Interfaces []struct {
					Name       string    `json:"name"`
					Model      string    `json:"model,omitempty"`
					MacAddress string    `json:"macAddress,omitempty"`
					Masquerade *struct{} `json:"masquerade,omitempty"`
					Bridge     *struct{} `json:"bridge,omitempty"`
					Binding    *struct {
						Name string `json:"name"`
					} `json:"binding,omitempty"`
				} `json:"interfaces,omitempty"`
			} `json:"devices"`
		} `json:"domain"`
		Networks []struct {
			Name   string    `json:"name"`
			Pod    *struct{} `json:"pod,omitempty"`
			Multus *struct {
				NetworkName string `json:"networkName"`
				Default     bool   `json:"default,omitempty"`
			} `json:"multus,omitempty"`
		} `json:"networks,omitempty"`
		Volumes []struct {
			Name          string `json:"name"`
			ContainerDisk *struct {
				Image string `json:"image"`
			} `json:"containerDisk,omitempty"`
			CloudInitNoCloud *struct {
				UserData string `json:"userData,omitempty"`
			} `json:"cloudInitNoCloud,omitempty"`
		} `json:"volumes,omitempty"`
	} `json:"spec"`
}
