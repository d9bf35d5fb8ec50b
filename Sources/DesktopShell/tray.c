// The tray icon: a StatusNotifierItem with its menu as com.canonical.dbusmenu, over GDBus (GTK 4
// has no tray of its own). It is shown whenever a StatusNotifierWatcher is on the session bus, and
// again when one comes back.

#include "roam_shell.h"
#include "shell_private.h"

#include <adwaita.h>

#define ITEM_PATH "/StatusNotifierItem"
#define MENU_PATH "/MenuBar"

static const char item_xml[] =
    "<node><interface name='org.kde.StatusNotifierItem'>"
    "<property name='Category' type='s' access='read'/>"
    "<property name='Id' type='s' access='read'/>"
    "<property name='Title' type='s' access='read'/>"
    "<property name='Status' type='s' access='read'/>"
    "<property name='IconName' type='s' access='read'/>"
    "<property name='ToolTip' type='(sa(iiay)ss)' access='read'/>"
    "<property name='Menu' type='o' access='read'/>"
    "<property name='ItemIsMenu' type='b' access='read'/>"
    "<method name='Activate'><arg type='i' direction='in'/><arg type='i' direction='in'/></method>"
    "<method name='SecondaryActivate'><arg type='i' direction='in'/><arg type='i' direction='in'/></method>"
    "<method name='ContextMenu'><arg type='i' direction='in'/><arg type='i' direction='in'/></method>"
    "<method name='Scroll'><arg type='i' direction='in'/><arg type='s' direction='in'/></method>"
    "<signal name='NewIcon'/><signal name='NewToolTip'/><signal name='NewTitle'/>"
    "<signal name='NewStatus'><arg type='s'/></signal>"
    "</interface></node>";

static const char menu_xml[] =
    "<node><interface name='com.canonical.dbusmenu'>"
    "<property name='Version' type='u' access='read'/>"
    "<property name='TextDirection' type='s' access='read'/>"
    "<property name='Status' type='s' access='read'/>"
    "<property name='IconThemePath' type='as' access='read'/>"
    "<method name='GetLayout'><arg type='i' direction='in'/><arg type='i' direction='in'/>"
    "<arg type='as' direction='in'/><arg type='u' direction='out'/><arg type='(ia{sv}av)' direction='out'/></method>"
    "<method name='GetGroupProperties'><arg type='ai' direction='in'/><arg type='as' direction='in'/>"
    "<arg type='a(ia{sv})' direction='out'/></method>"
    "<method name='GetProperty'><arg type='i' direction='in'/><arg type='s' direction='in'/>"
    "<arg type='v' direction='out'/></method>"
    "<method name='Event'><arg type='i' direction='in'/><arg type='s' direction='in'/><arg type='v' direction='in'/>"
    "<arg type='u' direction='in'/></method>"
    "<method name='EventGroup'><arg type='a(isvu)' direction='in'/><arg type='ai' direction='out'/></method>"
    "<method name='AboutToShow'><arg type='i' direction='in'/><arg type='b' direction='out'/></method>"
    "<method name='AboutToShowGroup'><arg type='ai' direction='in'/><arg type='ai' direction='out'/>"
    "<arg type='ai' direction='out'/></method>"
    "<signal name='LayoutUpdated'><arg type='u'/><arg type='i'/></signal>"
    "<signal name='ItemsPropertiesUpdated'><arg type='a(ia{sv})'/><arg type='a(ias)'/></signal>"
    "</interface></node>";

// What the tray shows and its place on the bus; main thread only.
static struct {
    GDBusConnection *bus;
    char *bus_name;
    char *icon;
    char *tooltip;
    GPtrArray *labels;  // char *, the menu's entries; item i has id i + 1
    GArray *enabled;    // gboolean
    guint32 revision;
    guint watch;
    gboolean held;
    /// A watcher is on the bus, and how many times in a row it refused the item.
    gboolean watched;
    int refusals;
} tray;

// The properties of menu item `id` (0: the root).
static GVariant *item_properties(gint32 id) {
    GVariantBuilder properties;
    g_variant_builder_init(&properties, G_VARIANT_TYPE("a{sv}"));
    if (id == 0) {
        g_variant_builder_add(&properties, "{sv}", "children-display", g_variant_new_string("submenu"));
    } else {
        g_variant_builder_add(&properties, "{sv}", "label", g_variant_new_string(g_ptr_array_index(tray.labels, id - 1)));
        g_variant_builder_add(&properties, "{sv}", "enabled",
                              g_variant_new_boolean(g_array_index(tray.enabled, gboolean, id - 1)));
        g_variant_builder_add(&properties, "{sv}", "visible", g_variant_new_boolean(TRUE));
    }
    return g_variant_builder_end(&properties);
}

static gboolean known_item(gint32 id) { return id >= 0 && id <= (gint32)tray.labels->len; }

static GVariant *layout(gint32 id) {
    GVariantBuilder children;
    g_variant_builder_init(&children, G_VARIANT_TYPE("av"));
    if (id == 0) {
        for (guint i = 0; i < tray.labels->len; i++) {
            GVariantBuilder none;
            g_variant_builder_init(&none, G_VARIANT_TYPE("av"));
            g_variant_builder_add(&children, "v",
                                  g_variant_new("(i@a{sv}av)", (gint32)i + 1, item_properties((gint32)i + 1), &none));
        }
    }
    return g_variant_new("(i@a{sv}av)", id, item_properties(id), &children);
}

static void menu_call(GDBusConnection *bus, const char *sender, const char *path, const char *interface,
                      const char *method, GVariant *parameters, GDBusMethodInvocation *invocation, gpointer unused) {
    (void)bus, (void)sender, (void)path, (void)interface, (void)unused;
    if (g_str_equal(method, "GetLayout")) {
        gint32 parent = 0, depth = 0;
        g_variant_get(parameters, "(ii^a&s)", &parent, &depth, NULL);
        if (!known_item(parent)) {
            g_dbus_method_invocation_return_dbus_error(invocation, "com.canonical.dbusmenu.Error", "no such item");
            return;
        }
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(u@(ia{sv}av))", tray.revision, layout(parent)));
    } else if (g_str_equal(method, "GetGroupProperties")) {
        GVariantIter *ids = NULL;
        g_variant_get(parameters, "(ai^a&s)", &ids, NULL);
        GVariantBuilder found;
        g_variant_builder_init(&found, G_VARIANT_TYPE("a(ia{sv})"));
        gint32 id = 0;
        while (g_variant_iter_next(ids, "i", &id)) {
            if (known_item(id)) g_variant_builder_add(&found, "(i@a{sv})", id, item_properties(id));
        }
        g_variant_iter_free(ids);
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(a(ia{sv}))", &found));
    } else if (g_str_equal(method, "GetProperty")) {
        gint32 id = 0;
        const char *name = NULL;
        g_variant_get(parameters, "(i&s)", &id, &name);
        GVariant *properties = known_item(id) ? g_variant_ref_sink(item_properties(id)) : NULL;
        GVariant *value = properties ? g_variant_lookup_value(properties, name, NULL) : NULL;
        if (properties) g_variant_unref(properties);
        if (value == NULL) {
            g_dbus_method_invocation_return_dbus_error(invocation, "com.canonical.dbusmenu.Error", "no such property");
            return;
        }
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(v)", value));
        g_variant_unref(value);
    } else if (g_str_equal(method, "Event")) {
        gint32 id = 0;
        const char *event = NULL;
        g_variant_get(parameters, "(i&svu)", &id, &event, NULL, NULL);
        g_dbus_method_invocation_return_value(invocation, NULL);
        if (g_str_equal(event, "clicked") && id >= 1 && known_item(id) && g_array_index(tray.enabled, gboolean, id - 1)) {
            roam_shell_callbacks.menu_chosen(roam_shell_callbacks.context, id - 1);
        }
    } else if (g_str_equal(method, "EventGroup")) {
        GVariantIter *events = NULL;
        g_variant_get(parameters, "(a(isvu))", &events);
        GVariantBuilder missing;
        g_variant_builder_init(&missing, G_VARIANT_TYPE("ai"));
        gint32 id = 0;
        const char *event = NULL;
        GArray *chosen = g_array_new(FALSE, FALSE, sizeof(gint32));
        while (g_variant_iter_next(events, "(i&svu)", &id, &event, NULL, NULL)) {
            if (!known_item(id)) g_variant_builder_add(&missing, "i", id);
            else if (g_str_equal(event, "clicked") && id >= 1) g_array_append_val(chosen, id);
        }
        g_variant_iter_free(events);
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(ai)", &missing));
        for (guint i = 0; i < chosen->len; i++) {
            gint32 item = g_array_index(chosen, gint32, i);
            if (g_array_index(tray.enabled, gboolean, item - 1)) {
                roam_shell_callbacks.menu_chosen(roam_shell_callbacks.context, item - 1);
            }
        }
        g_array_free(chosen, TRUE);
    } else if (g_str_equal(method, "AboutToShow")) {
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(b)", FALSE));
    } else if (g_str_equal(method, "AboutToShowGroup")) {
        GVariantBuilder none, missing;
        g_variant_builder_init(&none, G_VARIANT_TYPE("ai"));
        g_variant_builder_init(&missing, G_VARIANT_TYPE("ai"));
        g_dbus_method_invocation_return_value(invocation, g_variant_new("(aiai)", &none, &missing));
    } else {
        g_dbus_method_invocation_return_dbus_error(invocation, "org.freedesktop.DBus.Error.UnknownMethod", method);
    }
}

static GVariant *menu_property(GDBusConnection *bus, const char *sender, const char *path, const char *interface,
                               const char *name, GError **error, gpointer unused) {
    (void)bus, (void)sender, (void)path, (void)interface, (void)error, (void)unused;
    if (g_str_equal(name, "Version")) return g_variant_new_uint32(3);
    if (g_str_equal(name, "TextDirection")) return g_variant_new_string("ltr");
    if (g_str_equal(name, "Status")) return g_variant_new_string("normal");
    return g_variant_new_strv(NULL, 0);
}

static void item_call(GDBusConnection *bus, const char *sender, const char *path, const char *interface,
                      const char *method, GVariant *parameters, GDBusMethodInvocation *invocation, gpointer unused) {
    (void)bus, (void)sender, (void)path, (void)interface, (void)parameters, (void)unused;
    g_dbus_method_invocation_return_value(invocation, NULL);
    // A click on the icon shows the window; the menu is the item's other way in.
    if (g_str_equal(method, "Activate")) roam_shell_present();
}

static GVariant *item_property(GDBusConnection *bus, const char *sender, const char *path, const char *interface,
                               const char *name, GError **error, gpointer unused) {
    (void)bus, (void)sender, (void)path, (void)interface, (void)error, (void)unused;
    if (g_str_equal(name, "Category")) return g_variant_new_string("ApplicationStatus");
    if (g_str_equal(name, "Id")) return g_variant_new_string("roam-desktop");
    if (g_str_equal(name, "Title")) return g_variant_new_string("Roam");
    if (g_str_equal(name, "Status")) return g_variant_new_string("Active");
    if (g_str_equal(name, "IconName")) return g_variant_new_string(tray.icon ? tray.icon : "roam-off-symbolic");
    if (g_str_equal(name, "Menu")) return g_variant_new_object_path(MENU_PATH);
    if (g_str_equal(name, "ItemIsMenu")) return g_variant_new_boolean(FALSE);
    GVariantBuilder pixmaps;
    g_variant_builder_init(&pixmaps, G_VARIANT_TYPE("a(iiay)"));
    return g_variant_new("(sa(iiay)ss)", "", &pixmaps, "Roam", tray.tooltip ? tray.tooltip : "");
}

static void register_item(void);

static gboolean register_again(gpointer unused) {
    (void)unused;
    if (tray.watched) register_item();
    return G_SOURCE_REMOVE;
}

/// A watcher that has taken its name but not yet put up its object refuses the registration:
/// it is asked again every half second, 20 times at most, while it stays on the bus.
static void registered(GObject *source, GAsyncResult *result, gpointer unused) {
    (void)unused;
    GError *error = NULL;
    GVariant *reply = g_dbus_connection_call_finish(G_DBUS_CONNECTION(source), result, &error);
    if (reply != NULL) {
        g_variant_unref(reply);
        tray.refusals = 0;
        return;
    }
    g_error_free(error);
    if (tray.watched && tray.refusals < 20) {
        tray.refusals++;
        g_timeout_add(500, register_again, NULL);
    }
}

static void register_item(void) {
    g_dbus_connection_call(tray.bus, "org.kde.StatusNotifierWatcher", "/StatusNotifierWatcher",
                           "org.kde.StatusNotifierWatcher", "RegisterStatusNotifierItem",
                           g_variant_new("(s)", tray.bus_name), NULL, G_DBUS_CALL_FLAGS_NONE, 5000, NULL, registered, NULL);
}

static void watcher_appeared(GDBusConnection *bus, const char *name, const char *owner, gpointer unused) {
    (void)bus, (void)name, (void)owner, (void)unused;
    tray.watched = TRUE;
    tray.refusals = 0;
    register_item();
    // With a tray, closing the window leaves the app in the tray; "Quit" ends it.
    if (!tray.held) {
        tray.held = TRUE;
        g_application_hold(g_application_get_default());
        roam_shell_hide_on_close(TRUE);
    }
}

static void watcher_vanished(GDBusConnection *bus, const char *name, gpointer unused) {
    (void)bus, (void)name, (void)unused;
    tray.watched = FALSE;
    if (tray.held) {
        tray.held = FALSE;
        roam_shell_hide_on_close(FALSE);
        g_application_release(g_application_get_default());
    }
}

static gboolean start(void) {
    tray.bus = g_application_get_dbus_connection(g_application_get_default());
    if (tray.bus == NULL) return FALSE;
    tray.labels = g_ptr_array_new_with_free_func(g_free);
    tray.enabled = g_array_new(FALSE, FALSE, sizeof(gboolean));
    static const GDBusInterfaceVTable item_vtable = {item_call, item_property, NULL, {0}};
    static const GDBusInterfaceVTable menu_vtable = {menu_call, menu_property, NULL, {0}};
    GDBusNodeInfo *item = g_dbus_node_info_new_for_xml(item_xml, NULL);
    GDBusNodeInfo *menu = g_dbus_node_info_new_for_xml(menu_xml, NULL);
    g_dbus_connection_register_object(tray.bus, ITEM_PATH, item->interfaces[0], &item_vtable, NULL, NULL, NULL);
    g_dbus_connection_register_object(tray.bus, MENU_PATH, menu->interfaces[0], &menu_vtable, NULL, NULL, NULL);
    g_dbus_node_info_unref(item);
    g_dbus_node_info_unref(menu);
    // The item's name, as the specification has it; the watcher learns it at registration.
    tray.bus_name = g_strdup_printf("org.kde.StatusNotifierItem-%d-1", (int)getpid());
    g_bus_own_name_on_connection(tray.bus, tray.bus_name, G_BUS_NAME_OWNER_FLAGS_NONE, NULL, NULL, NULL, NULL);
    tray.watch = g_bus_watch_name_on_connection(tray.bus, "org.kde.StatusNotifierWatcher", G_BUS_NAME_WATCHER_FLAGS_NONE,
                                                watcher_appeared, watcher_vanished, NULL, NULL);
    return TRUE;
}

static void emit(const char *path, const char *interface, const char *signal, GVariant *parameters) {
    g_dbus_connection_emit_signal(tray.bus, NULL, path, interface, signal, parameters, NULL);
}

void roam_shell_tray_update(const char *icon, const char *tooltip, int count, const char *const *labels,
                            const bool *enabled) {
    if (tray.bus == NULL && !start()) return;
    gboolean new_icon = tray.icon == NULL || !g_str_equal(tray.icon, icon);
    gboolean new_tooltip = tray.tooltip == NULL || !g_str_equal(tray.tooltip, tooltip);
    gboolean new_menu = tray.labels->len != (guint)count;
    for (guint i = 0; !new_menu && i < (guint)count; i++) {
        new_menu = !g_str_equal(g_ptr_array_index(tray.labels, i), labels[i])
            || g_array_index(tray.enabled, gboolean, i) != (gboolean)enabled[i];
    }
    g_free(tray.icon);
    tray.icon = g_strdup(icon);
    g_free(tray.tooltip);
    tray.tooltip = g_strdup(tooltip);
    if (new_menu) {
        g_ptr_array_set_size(tray.labels, 0);
        g_array_set_size(tray.enabled, 0);
        for (int i = 0; i < count; i++) {
            g_ptr_array_add(tray.labels, g_strdup(labels[i]));
            gboolean on = enabled[i];
            g_array_append_val(tray.enabled, on);
        }
        tray.revision++;
        emit(MENU_PATH, "com.canonical.dbusmenu", "LayoutUpdated", g_variant_new("(ui)", tray.revision, 0));
    }
    if (new_icon) emit(ITEM_PATH, "org.kde.StatusNotifierItem", "NewIcon", NULL);
    if (new_tooltip) emit(ITEM_PATH, "org.kde.StatusNotifierItem", "NewToolTip", NULL);
}
