#include "roam_shell.h"
#include "shell_private.h"

#include <adwaita.h>
#include <stdlib.h>
#include <string.h>

// The one application and its widgets; touched only on the main thread.
RoamShellCallbacks roam_shell_callbacks;

static struct {
    AdwApplication *app;
    GtkWindow *window;
    GtkStack *stack;
    AdwStatusPage *welcome;
    GtkLabel *welcome_detail;
    GtkButton *import;
    GtkLabel *import_status;
    GtkLabel *state;
    GtkLabel *state_detail;
    GtkSwitch *toggle;
    gulong toggle_handler;
    AdwPreferencesGroup *banner_group;
    AdwActionRow *banner;
    AdwPreferencesGroup *details;
    GPtrArray *rows;
    AdwPreferencesGroup *profiles;
    GPtrArray *profile_rows;
    AdwToastOverlay *toasts;
    // Started hidden: the app runs until Quit, its window only hidden when closed.
    gboolean background;
    // The notification shown now (0: none), and the subscription to its actions.
    guint32 notification;
    guint action_subscription;
} shell;

static void activated(GApplication *app, gpointer unused) {
    (void)app;
    (void)unused;
    if (shell.window != NULL) {
        // A second start of the app lands here in the first instance: show what is there.
        gtk_window_present(shell.window);
        return;
    }
    roam_shell_callbacks.activate(roam_shell_callbacks.context);
}

int roam_shell_run(const char *app_id, RoamShellCallbacks callbacks) {
    roam_shell_callbacks = callbacks;
    shell.rows = g_ptr_array_new();
    shell.profile_rows = g_ptr_array_new();
    shell.app = adw_application_new(app_id, G_APPLICATION_DEFAULT_FLAGS);
    g_signal_connect(shell.app, "activate", G_CALLBACK(activated), NULL);
    // The app's own options are Swift's; GTK sees none.
    char *argv[] = {(char *)"roam-desktop", NULL};
    int status = g_application_run(G_APPLICATION(shell.app), 1, argv);
    g_object_unref(shell.app);
    return status;
}

static void toggled(GObject *toggle, GParamSpec *spec, gpointer unused) {
    (void)spec;
    (void)unused;
    roam_shell_callbacks.switch_toggled(roam_shell_callbacks.context, gtk_switch_get_active(GTK_SWITCH(toggle)));
}

static void log_in_pressed(GtkButton *button, gpointer unused) {
    (void)button;
    (void)unused;
    roam_shell_callbacks.log_in(roam_shell_callbacks.context);
}

static void import_pressed(GtkButton *button, gpointer unused) {
    (void)button;
    (void)unused;
    roam_shell_choose_profile(shell.window);
}

static GtkWidget *welcome_page(void) {
    shell.welcome = ADW_STATUS_PAGE(adw_status_page_new());
    adw_status_page_set_icon_name(shell.welcome, "network-vpn-symbolic");
    GtkWidget *column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 12);
    shell.import = GTK_BUTTON(gtk_button_new_with_label(""));
    gtk_widget_set_halign(GTK_WIDGET(shell.import), GTK_ALIGN_CENTER);
    gtk_widget_add_css_class(GTK_WIDGET(shell.import), "pill");
    gtk_widget_add_css_class(GTK_WIDGET(shell.import), "suggested-action");
    g_signal_connect(shell.import, "clicked", G_CALLBACK(import_pressed), NULL);
    shell.import_status = GTK_LABEL(gtk_label_new(""));
    gtk_label_set_wrap(shell.import_status, TRUE);
    gtk_label_set_selectable(shell.import_status, TRUE);
    gtk_label_set_justify(shell.import_status, GTK_JUSTIFY_CENTER);
    // Screen readers (and the tests) find where the import stands by this description.
    gtk_accessible_update_property(GTK_ACCESSIBLE(shell.import_status), GTK_ACCESSIBLE_PROPERTY_DESCRIPTION, "Import status", -1);
    shell.welcome_detail = GTK_LABEL(gtk_label_new(""));
    gtk_label_set_wrap(shell.welcome_detail, TRUE);
    gtk_widget_add_css_class(GTK_WIDGET(shell.welcome_detail), "dim-label");
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.import));
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.import_status));
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.welcome_detail));
    adw_status_page_set_child(shell.welcome, column);
    return GTK_WIDGET(shell.welcome);
}

static GtkWidget *details_page(void) {
    GtkWidget *column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 18);
    gtk_widget_set_margin_top(column, 24);
    gtk_widget_set_margin_bottom(column, 24);
    gtk_widget_set_margin_start(column, 12);
    gtk_widget_set_margin_end(column, 12);

    // The state, big, with the switch beside it.
    GtkWidget *head = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 12);
    GtkWidget *words = gtk_box_new(GTK_ORIENTATION_VERTICAL, 4);
    gtk_widget_set_hexpand(words, TRUE);
    shell.state = GTK_LABEL(gtk_label_new(""));
    gtk_label_set_xalign(shell.state, 0);
    gtk_label_set_wrap(shell.state, TRUE);
    gtk_widget_add_css_class(GTK_WIDGET(shell.state), "title-2");
    // Screen readers (and the tests) find the state by this description; its name is its text.
    gtk_accessible_update_property(GTK_ACCESSIBLE(shell.state), GTK_ACCESSIBLE_PROPERTY_DESCRIPTION, "Tunnel state", -1);
    shell.state_detail = GTK_LABEL(gtk_label_new(""));
    gtk_label_set_xalign(shell.state_detail, 0);
    gtk_label_set_wrap(shell.state_detail, TRUE);
    gtk_widget_add_css_class(GTK_WIDGET(shell.state_detail), "dim-label");
    gtk_box_append(GTK_BOX(words), GTK_WIDGET(shell.state));
    gtk_box_append(GTK_BOX(words), GTK_WIDGET(shell.state_detail));
    shell.toggle = GTK_SWITCH(gtk_switch_new());
    gtk_widget_set_valign(GTK_WIDGET(shell.toggle), GTK_ALIGN_CENTER);
    gtk_accessible_update_property(GTK_ACCESSIBLE(shell.toggle), GTK_ACCESSIBLE_PROPERTY_LABEL, "Tunnel", -1);
    shell.toggle_handler = g_signal_connect(shell.toggle, "notify::active", G_CALLBACK(toggled), NULL);
    gtk_box_append(GTK_BOX(head), words);
    gtk_box_append(GTK_BOX(head), GTK_WIDGET(shell.toggle));
    gtk_box_append(GTK_BOX(column), head);

    // The portal's banner: a row with the login button.
    shell.banner_group = ADW_PREFERENCES_GROUP(adw_preferences_group_new());
    shell.banner = ADW_ACTION_ROW(adw_action_row_new());
    adw_preferences_row_set_use_markup(ADW_PREFERENCES_ROW(shell.banner), FALSE);
    adw_action_row_set_icon_name(shell.banner, "dialog-warning-symbolic");
    GtkWidget *log_in = gtk_button_new_with_label("Log in");
    gtk_widget_set_valign(log_in, GTK_ALIGN_CENTER);
    gtk_widget_add_css_class(log_in, "suggested-action");
    g_signal_connect(log_in, "clicked", G_CALLBACK(log_in_pressed), NULL);
    adw_action_row_add_suffix(shell.banner, log_in);
    adw_preferences_group_add(shell.banner_group, GTK_WIDGET(shell.banner));
    gtk_widget_set_visible(GTK_WIDGET(shell.banner_group), FALSE);
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.banner_group));

    // The profiles first: which one runs is the first thing a user may want to change.
    shell.profiles = ADW_PREFERENCES_GROUP(adw_preferences_group_new());
    adw_preferences_group_set_title(shell.profiles, "Profiles");
    gtk_widget_set_visible(GTK_WIDGET(shell.profiles), FALSE);
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.profiles));

    shell.details = ADW_PREFERENCES_GROUP(adw_preferences_group_new());
    adw_preferences_group_set_title(shell.details, "Details");
    gtk_box_append(GTK_BOX(column), GTK_WIDGET(shell.details));

    GtkWidget *clamp = adw_clamp_new();
    adw_clamp_set_maximum_size(ADW_CLAMP(clamp), 600);
    adw_clamp_set_child(ADW_CLAMP(clamp), column);
    GtkWidget *scrolled = gtk_scrolled_window_new();
    gtk_scrolled_window_set_policy(GTK_SCROLLED_WINDOW(scrolled), GTK_POLICY_NEVER, GTK_POLICY_AUTOMATIC);
    gtk_scrolled_window_set_child(GTK_SCROLLED_WINDOW(scrolled), clamp);
    gtk_widget_set_vexpand(scrolled, TRUE);
    return scrolled;
}

void roam_shell_build_window(const char *title) {
    shell.window = GTK_WINDOW(adw_application_window_new(GTK_APPLICATION(shell.app)));
    gtk_window_set_title(shell.window, title);
    gtk_window_set_default_size(shell.window, 460, 620);
    GtkWidget *content = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0);
    GtkWidget *header = adw_header_bar_new();
    adw_header_bar_set_title_widget(ADW_HEADER_BAR(header), adw_window_title_new(title, NULL));
    gtk_box_append(GTK_BOX(content), header);
    shell.stack = GTK_STACK(gtk_stack_new());
    gtk_stack_add_named(shell.stack, welcome_page(), "welcome");
    gtk_stack_add_named(shell.stack, details_page(), "details");
    gtk_box_append(GTK_BOX(content), GTK_WIDGET(shell.stack));
    shell.toasts = ADW_TOAST_OVERLAY(adw_toast_overlay_new());
    adw_toast_overlay_set_child(shell.toasts, content);
    adw_application_window_set_content(ADW_APPLICATION_WINDOW(shell.window), GTK_WIDGET(shell.toasts));
    gtk_window_set_hide_on_close(shell.window, shell.background);
}

void roam_shell_keep_running(void) {
    if (shell.background) return;
    shell.background = TRUE;
    g_application_hold(G_APPLICATION(shell.app));
}

void roam_shell_toast(const char *text) {
    // A toast's title is markup; the text is the agent's words.
    char *escaped = g_markup_escape_text(text, -1);
    AdwToast *toast = adw_toast_new(escaped);
    g_free(escaped);
    adw_toast_set_timeout(toast, 5);
    // The overlay takes the one reference.
    adw_toast_overlay_add_toast(shell.toasts, toast);
}

void roam_shell_quit(void) { g_application_quit(G_APPLICATION(shell.app)); }

void roam_shell_hide_on_close(gboolean hide) {
    // A window that went away would leave the app running with nothing to show.
    if (shell.window != NULL) gtk_window_set_hide_on_close(shell.window, hide || shell.background);
}

void roam_shell_present(void) {
    if (shell.window != NULL) gtk_window_present(shell.window);
}

void roam_shell_show_welcome(const char *title, const char *body, const char *detail, const char *import_label,
                             const char *import_status, bool import_failed, bool busy) {
    adw_status_page_set_title(shell.welcome, title);
    adw_status_page_set_description(shell.welcome, body);
    gtk_label_set_text(shell.welcome_detail, detail);
    gtk_button_set_label(shell.import, import_label);
    gtk_widget_set_sensitive(GTK_WIDGET(shell.import), !busy);
    gtk_label_set_text(shell.import_status, import_status);
    gtk_widget_set_visible(GTK_WIDGET(shell.import_status), import_status[0] != '\0');
    if (import_failed) {
        gtk_widget_add_css_class(GTK_WIDGET(shell.import_status), "error");
    } else {
        gtk_widget_remove_css_class(GTK_WIDGET(shell.import_status), "error");
    }
    gtk_stack_set_visible_child_name(shell.stack, "welcome");
}

void roam_shell_show_details(const char *state, const char *detail, bool switch_on, bool switch_enabled,
                             const char *banner, const char *banner_button) {
    (void)banner_button;
    gtk_label_set_text(shell.state, state);
    gtk_label_set_text(shell.state_detail, detail);
    gtk_widget_set_visible(GTK_WIDGET(shell.state_detail), detail[0] != '\0');
    // What the agent says is not the user's flip: no request goes out for it.
    g_signal_handler_block(shell.toggle, shell.toggle_handler);
    gtk_switch_set_active(shell.toggle, switch_on);
    g_signal_handler_unblock(shell.toggle, shell.toggle_handler);
    gtk_widget_set_sensitive(GTK_WIDGET(shell.toggle), switch_enabled);
    gtk_widget_set_visible(GTK_WIDGET(shell.banner_group), banner != NULL);
    if (banner != NULL) adw_preferences_row_set_title(ADW_PREFERENCES_ROW(shell.banner), banner);
    gtk_stack_set_visible_child_name(shell.stack, "details");
}

void roam_shell_set_rows(int count, const char *const *titles, const char *const *values) {
    for (guint i = shell.rows->len; i < (guint)count; i++) {
        GtkWidget *row = adw_action_row_new();
        // Values come from the agent: text, never markup.
        adw_preferences_row_set_use_markup(ADW_PREFERENCES_ROW(row), FALSE);
        adw_preferences_group_add(shell.details, row);
        g_ptr_array_add(shell.rows, row);
    }
    for (guint i = 0; i < shell.rows->len; i++) {
        AdwActionRow *row = g_ptr_array_index(shell.rows, i);
        gboolean shown = i < (guint)count;
        gtk_widget_set_visible(GTK_WIDGET(row), shown);
        if (!shown) continue;
        adw_preferences_row_set_title(ADW_PREFERENCES_ROW(row), titles[i]);
        adw_action_row_set_subtitle(row, values[i]);
    }
    gtk_widget_set_visible(GTK_WIDGET(shell.details), count > 0);
}

static void use_pressed(GtkButton *button, gpointer index) {
    (void)button;
    roam_shell_callbacks.profile_chosen(roam_shell_callbacks.context, GPOINTER_TO_INT(index));
}

void roam_shell_set_profiles(int count, const char *const *names, const char *const *subtitles,
                             const char *const *buttons, const char *const *descriptions) {
    // Few rows, rarely changed: made afresh each time, so a button's index is always its row's.
    for (guint i = 0; i < shell.profile_rows->len; i++) {
        adw_preferences_group_remove(shell.profiles, g_ptr_array_index(shell.profile_rows, i));
    }
    g_ptr_array_set_size(shell.profile_rows, 0);
    for (int i = 0; i < count; i++) {
        GtkWidget *row = adw_action_row_new();
        adw_preferences_row_set_use_markup(ADW_PREFERENCES_ROW(row), FALSE);
        adw_preferences_row_set_title(ADW_PREFERENCES_ROW(row), names[i]);
        adw_action_row_set_subtitle(ADW_ACTION_ROW(row), subtitles[i]);
        if (buttons[i] != NULL) {
            GtkWidget *use = gtk_button_new_with_label(buttons[i]);
            gtk_widget_set_valign(use, GTK_ALIGN_CENTER);
            gtk_accessible_update_property(GTK_ACCESSIBLE(use), GTK_ACCESSIBLE_PROPERTY_LABEL, descriptions[i], -1);
            g_signal_connect(use, "clicked", G_CALLBACK(use_pressed), GINT_TO_POINTER(i));
            adw_action_row_add_suffix(ADW_ACTION_ROW(row), use);
        } else {
            GtkWidget *mark = gtk_image_new_from_icon_name("object-select-symbolic");
            adw_action_row_add_suffix(ADW_ACTION_ROW(row), mark);
        }
        adw_preferences_group_add(shell.profiles, row);
        g_ptr_array_add(shell.profile_rows, row);
    }
    gtk_widget_set_visible(GTK_WIDGET(shell.profiles), count > 0);
}

char *roam_shell_spawn(const char *const *argv) {
    GError *error = NULL;
    // Without G_SPAWN_DO_NOT_REAP_CHILD, GLib reaps the child: no zombie is left behind.
    if (g_spawn_async(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, NULL, &error)) return NULL;
    char *why = strdup(error->message);
    g_error_free(error);
    return why;
}

static void action_invoked(GDBusConnection *bus, const char *sender, const char *path, const char *interface,
                           const char *signal, GVariant *parameters, gpointer unused) {
    (void)bus, (void)sender, (void)path, (void)interface, (void)signal, (void)unused;
    guint32 id = 0;
    const char *key = NULL;
    g_variant_get(parameters, "(u&s)", &id, &key);
    // Every application's notifications are announced on the bus: only ours count.
    if (id != 0 && id == shell.notification) roam_shell_callbacks.notification_action(roam_shell_callbacks.context, key);
}

// While a Notify is on its way the id to replace is unknown: what comes meanwhile waits for its
// answer, so two notifications are never shown at once.
static struct {
    gboolean in_flight;
    GVariant *next;   // the next Notify's (title, body, icon, actions), or NULL
    gboolean withdraw; // take it away once its id is known
} notify_queue;

static void send_notify(GVariant *what);

static void notified(GObject *bus, GAsyncResult *result, gpointer unused) {
    (void)unused;
    GError *error = NULL;
    GVariant *reply = g_dbus_connection_call_finish(G_DBUS_CONNECTION(bus), result, &error);
    notify_queue.in_flight = FALSE;
    if (reply == NULL) {
        // No notification server (no desktop session): the window still says it all.
        g_message("cannot show a notification: %s", error->message);
        g_error_free(error);
    } else {
        g_variant_get(reply, "(u)", &shell.notification);
        g_variant_unref(reply);
    }
    if (notify_queue.next != NULL) {
        GVariant *next = notify_queue.next;
        notify_queue.next = NULL;
        send_notify(next);
        g_variant_unref(next);
    } else if (notify_queue.withdraw) {
        notify_queue.withdraw = FALSE;
        roam_shell_withdraw();
    }
}

static void send_notify(GVariant *what) {
    GDBusConnection *bus = g_application_get_dbus_connection(G_APPLICATION(shell.app));
    if (bus == NULL) return;
    const char *title, *body, *icon;
    GVariant *actions;
    g_variant_get(what, "(&s&s&s@as)", &title, &body, &icon, &actions);
    GVariantBuilder hints;
    g_variant_builder_init(&hints, G_VARIANT_TYPE("a{sv}"));
    g_variant_builder_add(&hints, "{sv}", "desktop-entry", g_variant_new_string("roam-desktop"));
    g_variant_builder_add(&hints, "{sv}", "urgency", g_variant_new_byte(1));
    notify_queue.in_flight = TRUE;
    // Replacing the one shown keeps a single notification however often the news changes.
    g_dbus_connection_call(bus, "org.freedesktop.Notifications", "/org/freedesktop/Notifications",
                           "org.freedesktop.Notifications", "Notify",
                           g_variant_new("(susss@asa{sv}i)", "Roam", shell.notification, icon, title, body, actions,
                                         &hints, -1),
                           G_VARIANT_TYPE("(u)"), G_DBUS_CALL_FLAGS_NONE, 5000, NULL, notified, NULL);
    g_variant_unref(actions);
}

void roam_shell_notify(const char *title, const char *body, const char *icon, int count,
                       const char *const *keys, const char *const *labels) {
    GDBusConnection *bus = g_application_get_dbus_connection(G_APPLICATION(shell.app));
    if (bus == NULL) return;
    if (shell.action_subscription == 0) {
        shell.action_subscription = g_dbus_connection_signal_subscribe(
            bus, NULL, "org.freedesktop.Notifications", "ActionInvoked", "/org/freedesktop/Notifications", NULL,
            G_DBUS_SIGNAL_FLAGS_NONE, action_invoked, NULL, NULL);
    }
    GVariantBuilder actions;
    g_variant_builder_init(&actions, G_VARIANT_TYPE("as"));
    for (int i = 0; i < count; i++) {
        g_variant_builder_add(&actions, "s", keys[i]);
        g_variant_builder_add(&actions, "s", labels[i]);
    }
    GVariant *what = g_variant_ref_sink(g_variant_new("(sss@as)", title, body, icon, g_variant_builder_end(&actions)));
    notify_queue.withdraw = FALSE;
    if (notify_queue.in_flight) {
        if (notify_queue.next != NULL) g_variant_unref(notify_queue.next);
        notify_queue.next = what;
        return;
    }
    send_notify(what);
    g_variant_unref(what);
}

void roam_shell_withdraw(void) {
    if (notify_queue.in_flight) {
        if (notify_queue.next != NULL) g_variant_unref(notify_queue.next);
        notify_queue.next = NULL;
        notify_queue.withdraw = TRUE;
        return;
    }
    GDBusConnection *bus = g_application_get_dbus_connection(G_APPLICATION(shell.app));
    if (bus == NULL || shell.notification == 0) return;
    g_dbus_connection_call(bus, "org.freedesktop.Notifications", "/org/freedesktop/Notifications",
                           "org.freedesktop.Notifications", "CloseNotification", g_variant_new("(u)", shell.notification),
                           NULL, G_DBUS_CALL_FLAGS_NONE, 5000, NULL, NULL, NULL);
    shell.notification = 0;
}

static gboolean deliver_now(gpointer item) {
    roam_shell_callbacks.deliver(roam_shell_callbacks.context, item);
    return G_SOURCE_REMOVE;
}

void roam_shell_post(void *item) { g_idle_add(deliver_now, item); }

typedef struct {
    void (*work)(void *);
    void *argument;
} Job;

static gpointer run_job(gpointer data) {
    Job job = *(Job *)data;
    g_free(data);
    job.work(job.argument);
    return NULL;
}

void roam_shell_background(void (*work)(void *argument), void *argument) {
    Job *job = g_new(Job, 1);
    job->work = work;
    job->argument = argument;
    g_thread_unref(g_thread_new("roam-desktop", run_job, job));
}
