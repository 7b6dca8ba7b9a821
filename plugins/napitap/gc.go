package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// GC finds the attachments of this network that the runtime no longer
// lists where napitap recorded them, napitapd and the Kata DAN files, and
// removes them whole: a runtime that crashed between ADD and DEL leaves
// the tap and its wiring in a pod netns that may still exist, napitapd's
// queues, and the DAN entry.

// leftover is one such attachment.
type leftover struct {
	key      handoff.Key
	netns    string
	netnsID  uint64
	tapName  string
	wiring   string
	bridge   string
	guestMAC net.HardwareAddr
}

// remove deletes the leftover's tap and wiring, but only in the very netns
// that was recorded, and only a tap marked as this attachment's: a path that
// now names another pod's netns, or a tap of another attachment, is left
// alone.
func (l leftover) remove() error {
	if l.wiring == config.WiringNodeBridge {
		// In the node's netns, which the pod's going does not empty.
		err := tapsetup.DeleteTap(l.tapName, tapsetup.OwnerAlias(l.key.ContainerID, l.key.IfName))
		if errors.Is(err, tapsetup.ErrNotTap) {
			return nil
		}
		return err
	}
	if id, err := tapsetup.NetnsID(l.netns); err != nil || l.netnsID == 0 || id != l.netnsID {
		return nil // the netns went, and the tap with it
	}
	err := ns.WithNetNSPath(l.netns, func(ns.NetNS) error {
		err := tapsetup.DeleteTap(l.tapName, tapsetup.OwnerAlias(l.key.ContainerID, l.key.IfName))
		if errors.Is(err, tapsetup.ErrNotTap) {
			return nil
		}
		if err != nil {
			return err
		}
		switch l.wiring {
		case config.WiringTCRedirect:
			return tapsetup.UnwireRedirect(l.key.IfName)
		case config.WiringBridge:
			return tapsetup.UnwireBridge(l.bridge, l.key.IfName, tapsetup.PeerIdentity{MAC: l.guestMAC},
				tapsetup.OwnerAlias(l.key.ContainerID, l.key.IfName))
		}
		return nil
	})
	if isGone(err) {
		return nil
	}
	return err
}

// gcHandoff removes the leftovers napitapd knows, then has napitapd close
// their queues. napitapd down is no error: it sweeps on its own.
func gcHandoff(conf *config.Config) {
	if conf.HandoffSocket == "" {
		return
	}
	client := &handoff.Client{Socket: conf.HandoffSocket}
	atts, err := client.List()
	if err != nil {
		if !errors.Is(err, handoff.ErrUnreachable) {
			fmt.Fprintf(os.Stderr, "napitap: gc: list napitapd: %v\n", err)
		}
		return
	}
	valid := validKeys(conf)
	for _, att := range atts {
		if att.Network != conf.Name || slices.Contains(valid, att.Key) {
			continue
		}
		mac, _ := net.ParseMAC(att.MAC)
		l := leftover{key: att.Key, netns: att.Netns, netnsID: att.NetnsID, tapName: att.TapName,
			wiring: att.Wiring, bridge: att.Bridge, guestMAC: mac}
		if err := l.remove(); err != nil {
			fmt.Fprintf(os.Stderr, "napitap: gc: %s: %v\n", att.Key, err)
		}
	}
	if _, err := client.GC(conf.Name, valid); err != nil {
		fmt.Fprintf(os.Stderr, "napitap: gc in napitapd: %v\n", err)
	}
}

// gcKataDan removes the leftovers the DAN files know, then their entries.
func gcKataDan(conf *config.Config) error {
	if conf.KataDanDir == "" {
		return nil
	}
	valid := validKeys(conf)
	keep := func(sandbox, ifName string) bool {
		return slices.Contains(valid, handoff.Key{ContainerID: sandbox, IfName: ifName})
	}
	stale, err := katadan.Stale(conf.KataDanDir, conf.Name, keep)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("kataDan: %v", err), "")
	}
	var errs []error
	for _, e := range stale {
		mac, _ := net.ParseMAC(e.GuestMAC)
		l := leftover{key: handoff.Key{ContainerID: e.Sandbox, IfName: e.Name}, netns: e.Netns, netnsID: e.NetnsID,
			tapName: e.Device.Device.TapName, wiring: e.Wiring, bridge: e.Bridge, guestMAC: mac}
		if err := l.remove(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.key, err))
			continue
		}
		errs = append(errs, katadan.Remove(conf.KataDanDir, e.Sandbox, e.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("kataDan gc: %v", err), "")
	}
	return nil
}

func validKeys(conf *config.Config) []handoff.Key {
	valid := make([]handoff.Key, 0, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid = append(valid, handoff.Key{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	return valid
}
