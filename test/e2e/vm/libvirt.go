package vm

import (
	"encoding/xml"
	"fmt"
	"os"
	"strings"
)

// Domain is a libvirt domain of the same guest QEMUArgs boots: TCG
// (type 'qemu'), direct kernel boot, the console on a file, and one
// virtio NIC on an existing tap that libvirt opens by name
// (<interface type='ethernet'> with <target managed='no'/>), as KubeVirt's
// tap binding and DESIGN.md fact 14 do.
type Domain struct {
	Name           string
	Kernel, Initrd string
	Guest          Guest
	Tap            string // the tap libvirt opens, e.g. "tap0"
	// Queues is the NIC's queue pairs (<driver queues=N/>) and the vCPU
	// count, so that the guest's virtio_net enables every pair.
	Queues     int
	SerialPath string
	// ScriptPath is a file that holds Guest.Script, for the fw_cfg entry
	// (libvirt 9.0 hands an inline entry value to QEMU with its XML escapes
	// left in: "&&" arrived as "&amp;&amp;"). WriteScript writes it.
	ScriptPath string
	// NoGuestTSO: as QEMUArgs' noGuestTSO, through <host tso4='off' .../>.
	NoGuestTSO bool
}

// XML is the domain's definition for `virsh define`. The NIC's driver is
// 'qemu' (vhost=off): QEMU writes each frame into the queue fd, as in
// QEMUArgs' vhost=off, so both boot paths compare.
func (d Domain) XML() (string, error) {
	if d.Name == "" || d.Kernel == "" || d.Initrd == "" || d.Tap == "" || d.SerialPath == "" {
		return "", fmt.Errorf("vm: domain needs a name, kernel, initrd, tap and serial path: %+v", d)
	}
	if d.Guest.Script != "" && d.ScriptPath == "" {
		return "", fmt.Errorf("vm: domain %s: a guest script needs a ScriptPath", d.Name)
	}
	queues := max(d.Queues, 1)
	dom := domainXML{
		Type: "qemu", Name: d.Name,
		Memory: sizeXML{Unit: "MiB", Value: 256},
		VCPU:   queues,
		OS: osXML{
			Type:    osTypeXML{Arch: "x86_64", Machine: "q35", Value: "hvm"},
			Kernel:  d.Kernel,
			Initrd:  d.Initrd,
			Cmdline: KernelCmdline(d.Guest),
		},
		Features:   &featuresXML{},
		OnPoweroff: "destroy", OnReboot: "destroy", OnCrash: "destroy",
		Devices: devicesXML{
			Emulator:   "/usr/bin/qemu-system-x86_64",
			Controller: []controllerXML{{Type: "usb", Model: "none"}},
			Interface: interfaceXML{
				Type:   "ethernet",
				Target: targetXML{Dev: d.Tap, Managed: "no"},
				Model:  modelXML{Type: "virtio"},
				Driver: driverXML{Name: "qemu"},
				ROM:    romXML{Enabled: "no"},
			},
			Serial:     serialXML{Type: "file", Source: sourceXML{Path: d.SerialPath}, Target: portXML{Port: 0}},
			Memballoon: modelXML{Model: "none"},
		},
	}
	if queues > 1 {
		dom.Devices.Interface.Driver.Queues = queues
	}
	if d.NoGuestTSO {
		dom.Devices.Interface.Driver.Host = &hostXML{TSO4: "off", TSO6: "off", ECN: "off", UFO: "off"}
	}
	if d.Guest.MAC != "" {
		dom.Devices.Interface.MAC = &macXML{Address: strings.ToLower(d.Guest.MAC)}
	}
	if d.Guest.Script != "" {
		dom.Sysinfo = &sysinfoXML{Type: "fwcfg", Entry: []entryXML{{Name: fwCfgScript, File: d.ScriptPath}}}
	}
	b, err := xml.MarshalIndent(dom, "", "  ")
	if err != nil {
		return "", fmt.Errorf("vm: domain %s: %w", d.Name, err)
	}
	return string(b) + "\n", nil
}

// WriteScript writes Guest.Script to ScriptPath (nothing without a script).
func (d Domain) WriteScript() error {
	if d.Guest.Script == "" {
		return nil
	}
	if d.ScriptPath == "" {
		return fmt.Errorf("vm: domain %s: a guest script needs a ScriptPath", d.Name)
	}
	return os.WriteFile(d.ScriptPath, []byte(d.Guest.Script), 0o644)
}

// The subset of libvirt's domain schema the guest needs.
type domainXML struct {
	XMLName    xml.Name     `xml:"domain"`
	Type       string       `xml:"type,attr"`
	Name       string       `xml:"name"`
	Memory     sizeXML      `xml:"memory"`
	VCPU       int          `xml:"vcpu"`
	OS         osXML        `xml:"os"`
	Sysinfo    *sysinfoXML  `xml:"sysinfo"`
	Features   *featuresXML `xml:"features"`
	OnPoweroff string       `xml:"on_poweroff"`
	OnReboot   string       `xml:"on_reboot"`
	OnCrash    string       `xml:"on_crash"`
	Devices    devicesXML   `xml:"devices"`
}

type sizeXML struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

type osXML struct {
	Type    osTypeXML `xml:"type"`
	Kernel  string    `xml:"kernel"`
	Initrd  string    `xml:"initrd"`
	Cmdline string    `xml:"cmdline"`
}

type osTypeXML struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr"`
	Value   string `xml:",chardata"`
}

type sysinfoXML struct {
	Type  string     `xml:"type,attr"`
	Entry []entryXML `xml:"entry"`
}

type entryXML struct {
	Name string `xml:"name,attr"`
	File string `xml:"file,attr"`
}

// featuresXML turns ACPI on, as plain QEMU has it (libvirt adds -no-acpi
// otherwise).
type featuresXML struct {
	ACPI struct{} `xml:"acpi"`
}

type devicesXML struct {
	Emulator   string          `xml:"emulator"`
	Controller []controllerXML `xml:"controller"`
	Interface  interfaceXML    `xml:"interface"`
	Serial     serialXML       `xml:"serial"`
	Memballoon modelXML        `xml:"memballoon"`
}

type controllerXML struct {
	Type  string `xml:"type,attr"`
	Model string `xml:"model,attr"`
}

type interfaceXML struct {
	Type   string    `xml:"type,attr"`
	MAC    *macXML   `xml:"mac"`
	Target targetXML `xml:"target"`
	Model  modelXML  `xml:"model"`
	Driver driverXML `xml:"driver"`
	ROM    romXML    `xml:"rom"`
}

type macXML struct {
	Address string `xml:"address,attr"`
}

type targetXML struct {
	Dev     string `xml:"dev,attr"`
	Managed string `xml:"managed,attr"`
}

type modelXML struct {
	Type  string `xml:"type,attr,omitempty"`
	Model string `xml:"model,attr,omitempty"`
}

type driverXML struct {
	Name   string   `xml:"name,attr"`
	Queues int      `xml:"queues,attr,omitempty"`
	Host   *hostXML `xml:"host"`
}

type hostXML struct {
	TSO4 string `xml:"tso4,attr"`
	TSO6 string `xml:"tso6,attr"`
	ECN  string `xml:"ecn,attr"`
	UFO  string `xml:"ufo,attr"`
}

type romXML struct {
	Enabled string `xml:"enabled,attr"`
}

type serialXML struct {
	Type   string    `xml:"type,attr"`
	Source sourceXML `xml:"source"`
	Target portXML   `xml:"target"`
}

type sourceXML struct {
	Path string `xml:"path,attr"`
}

type portXML struct {
	Port int `xml:"port,attr"`
}
