"""Domains and tools of tools/gen_toolcall_corpus.py. A tool is
T(name, description, verb phrases, parameters...), a parameter r(name, P)
(required) or o(name, P) (optional), P from tools/corpus_params.py."""
from corpus_params import (A, AO, B, E, I, N, O, S, AIRPORTS, ARTISTS, BOOKS, CARS, CHANNELS,
                           CHARITIES, CITIES, COLORS, COURSES, CUISINES, DATES, DISHES,
                           DOCS, DRUGS, EMAILS, EXERCISES, GAMES, GENRES, HHMM, ISO_DATES,
                           ITEMS, LANGS, MESSAGES, MOVIES, NOTES, PEOPLE, PETS, PHRASES_TR, PLACES,
                           PLANTS, PODCASTS, PROJECTS, RESTAURANTS, ROOMS, SONGS, STOCKS, STREETS,
                           SUBJECTS, TASKS, TEAMS, TIMES, TOPICS, ZIPS)


def T(name, desc, verbs, *params):
    return {"name": name, "description": desc, "verbs": verbs, "params": list(params)}


def r(name, p):
    return (name, p, True)


def o(name, p):
    return (name, p, False)


# shared parameters
CITY = S("City name", CITIES, ["in {v}", "for {v}", "at {v}"])
DATE = S("Day, as the user said it", DATES, ["{v}", "for {v}"])
ISO = S("Date as YYYY-MM-DD", ISO_DATES, ["on {v}", "for {v}"], pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
TIME = S("Time of day, as said", TIMES, ["at {v}"])
CLOCK = S("24-hour time HH:MM", HHMM, ["at {v}"], pattern="^[0-2][0-9]:[0-5][0-9]$")
PERSON = S("Contact name", PEOPLE, ["to {v}"])
WITH = S("Person's name", PEOPLE, ["with {v}"])
MSG = S("Message text", MESSAGES, ["saying \"{v}\"", "that says {v}", ": {v}"], maxLength=200)
EMAIL = S("Email address", EMAILS, ["to {v}"], pattern="^[^@ ]+@[^@ ]+$")
UNIT = E("Temperature unit", ["celsius", "fahrenheit"], ["in {v}"])
CURRENCY = E("ISO currency code", ["USD", "EUR", "GBP", "JPY", "NGN", "INR"], ["in {v}"])
AMOUNT = N("Amount of money", 0.01, 100000, ["of {v}", "for {v}"], span=(1, 2500))
COUNT = I("How many", 1, 20, ["{v} of them"], span=(1, 12))
PRIORITY = E("Priority", ["low", "normal", "high", "urgent"], ["with {v} priority", "marked {v}"])
ROOM = S("Room", ROOMS, ["in the {v}"])
MINUTES = I("Duration in minutes", 1, 600, ["for {v} minutes"], span=(1, 120))
PEOPLE_N = I("Number of people", 1, 20, ["for {v} people", "party of {v}"], span=(1, 10))
ADDRESS = O("Postal address", [r("street", S("Street and number", STREETS, ["{v}"])),
                               r("city", S("City", CITIES, ["{v}"])),
                               o("zip", S("ZIP code", ZIPS, ["{v}"], pattern="^[0-9]{5}$"))],
            ["to", "at", "delivered to"])
REPEAT = O("How the event repeats", [r("frequency", E("Repeat unit", ["daily", "weekly", "monthly", "yearly"], ["{v}"])),
                                     o("interval", I("Every how many units", 1, 12, ["every {v}"], span=(1, 4)))],
           ["repeating", "recurring"])

DOMAINS = [
    ("weather", [
        T("get_current_weather", "Current weather conditions for a city",
          ["what's the weather", "check the weather", "how is the weather", "tell me the weather"],
          r("city", CITY), o("unit", UNIT)),
        T("get_forecast", "Weather forecast for the coming days",
          ["get the forecast", "what's the forecast", "show me the weather forecast"],
          r("city", CITY), o("days", I("Days ahead", 1, 14, ["for the next {v} days"], span=(1, 10))),
          o("unit", UNIT)),
        T("get_air_quality", "Air quality index for a city", ["what's the air quality", "check air pollution"],
          r("city", CITY)),
    ]),
    ("calendar", [
        T("create_event", "Add an event to the user's calendar",
          ["add an event", "schedule", "put on my calendar", "create a calendar entry"],
          r("title", S("Event title", TOPICS, ["called {v}", "for {v}", "titled \"{v}\""])), r("date", DATE),
          o("time", TIME), o("duration_minutes", MINUTES), o("attendees", A("People invited", PEOPLE[:24], ["with {v}", "inviting {v}"])),
          o("repeat", REPEAT)),
        T("list_events", "List calendar events on a day", ["what's on my calendar", "list my events", "what do I have"],
          r("date", DATE)),
        T("delete_event", "Remove an event from the calendar", ["cancel", "delete the event", "remove"],
          r("title", S("Event title", TOPICS, ["{v}", "called {v}"])), o("date", DATE)),
    ]),
    ("email", [
        T("send_email", "Send an email", ["send an email", "email", "write an email", "shoot off a mail"],
          r("to", EMAIL), r("subject", S("Subject line", SUBJECTS, ["with subject \"{v}\"", "about {v}"])),
          o("body", MSG), o("cc", A("Copy recipients", EMAILS, ["cc {v}", "copying {v}"], 1, 2)),
          o("urgent", B("Mark as urgent", ["and mark it urgent", "as urgent"], ["not urgent"]))),
        T("search_email", "Search the mailbox", ["search my email", "find emails", "look for mails"],
          r("query", S("Search words", SUBJECTS, ["about {v}", "matching {v}"])),
          o("unread_only", B("Only unread mail", ["that are unread", "unread only"], ["including read ones"])),
          o("limit", I("Maximum results", 1, 50, ["top {v}", "at most {v}"], span=(1, 20)))),
    ]),
    ("music", [
        T("play_music", "Play music", ["play", "put on", "start playing", "queue up"],
          r("query", S("Song, artist or genre", SONGS + ARTISTS + GENRES, ["{v}", "some {v}"])),
          o("shuffle", B("Shuffle", ["on shuffle", "shuffled"], ["in order", "without shuffle"])),
          o("volume", I("Volume percent", 0, 100, ["at volume {v}", "at {v} percent volume"]))),
        T("pause_music", "Pause playback", ["pause the music", "stop the music", "pause playback"]),
        T("skip_track", "Skip tracks", ["skip", "next song", "skip ahead"],
          o("count", I("Tracks to skip", 1, 10, ["{v} songs", "{v} tracks"], span=(1, 5)))),
        T("add_to_playlist", "Add a song to a playlist", ["add", "save", "put"],
          r("song", S("Song title", SONGS, ["{v}"])),
          r("playlist", S("Playlist name", ["Road Trip", "Chill", "Workout", "Focus", "Party Mix"], ["to my {v} playlist", "to {v}"]))),
    ]),
    ("smart_home", [
        T("set_lights", "Turn lights on or off, set brightness and color", ["set the lights", "turn the lights", "change the lights"],
          r("room", ROOM), r("on", B("Lights on", ["on", "on please"], ["off", "off please"])),
          o("brightness", I("Brightness percent", 0, 100, ["to {v} percent", "at {v}% brightness"])),
          o("color", E("Light color", COLORS, ["in {v}", "to {v}"]))),
        T("set_thermostat", "Set the thermostat target temperature", ["set the thermostat", "set the heating", "make it"],
          r("temperature", N("Target temperature", 5, 35, ["to {v} degrees", "{v} degrees"], span=(15, 28))),
          o("room", ROOM), o("unit", UNIT)),
        T("lock_door", "Lock or unlock a door", ["lock", "unlock", "secure"],
          r("door", E("Which door", ["front", "back", "garage", "side"], ["the {v} door"])),
          r("locked", B("Lock it", ["now", "and keep it locked"], ["let it open", "and unlock it"]))),
        T("run_scene", "Run a saved home scene", ["run the scene", "activate", "start the scene"],
          r("scene", E("Scene name", ["movie night", "good morning", "away", "bedtime", "dinner"], ["{v}"]))),
    ]),
    ("banking", [
        T("get_balance", "Account balance", ["what's my balance", "check my balance", "how much money do I have"],
          r("account", E("Account", ["checking", "savings", "credit card"], ["in {v}", "on my {v} account"]))),
        T("transfer_money", "Transfer money between people or accounts", ["transfer", "send money", "move"],
          r("amount", AMOUNT), r("to", PERSON), o("currency", CURRENCY), o("note", S("Memo", ["rent", "dinner", "birthday gift", "tickets", "loan"], ["for {v}", "memo {v}"]))),
        T("list_transactions", "Recent transactions", ["show my transactions", "list recent payments"],
          o("days", I("Days back", 1, 90, ["from the last {v} days", "over the past {v} days"], span=(1, 60))),
          o("min_amount", N("Minimum amount", 0, 100000, ["over {v}", "above {v}"], span=(10, 500)))),
        T("freeze_card", "Freeze or unfreeze a card", ["freeze my card", "block my card", "lock my card"],
          r("card_last4", S("Last four digits", ["4821", "0937", "7750", "1204", "6613"], ["ending in {v}", "ending {v}"], pattern="^[0-9]{4}$"))),
    ]),
    ("flights", [
        T("search_flights", "Search for flights", ["find flights", "search flights", "look for a flight", "book me a flight"],
          r("origin", S("Origin airport code", AIRPORTS, ["from {v}"])), r("destination", S("Destination airport code", AIRPORTS, ["to {v}"])),
          r("date", ISO), o("passengers", I("Passengers", 1, 9, ["for {v} passengers", "for {v} people"], span=(1, 6))),
          o("cabin", E("Cabin class", ["economy", "premium", "business", "first"], ["in {v}", "{v} class"])),
          o("nonstop", B("Nonstop only", ["nonstop", "direct only"], ["with stops allowed", "any number of stops"]))),
        T("check_flight_status", "Status of a flight", ["what's the status of flight", "is flight", "check flight"],
          r("flight_number", S("Flight number", ["BA117", "LH400", "AF22", "UA901", "DL45", "EK202"], ["{v}"], pattern="^[A-Z]{2}[0-9]{1,4}$"))),
    ]),
    ("hotels", [
        T("search_hotels", "Find hotels", ["find a hotel", "search hotels", "look for a place to stay"],
          r("city", CITY), r("check_in", ISO), o("nights", I("Nights", 1, 30, ["for {v} nights"], span=(1, 10))),
          o("guests", I("Guests", 1, 8, ["for {v} guests"], span=(1, 5))),
          o("max_price", N("Max price per night", 0, 5000, ["under {v}", "below {v} a night"], span=(50, 400))),
          o("amenities", A("Required amenities", ["pool", "gym", "parking", "breakfast", "wifi", "pets allowed"], ["with {v}"]))),
        T("cancel_booking", "Cancel a hotel booking", ["cancel my booking", "cancel the reservation"],
          r("booking_id", S("Booking reference", ["HX4512", "BK9921", "RS1187", "QT7070"], ["{v}", "number {v}"]))),
    ]),
    ("messaging", [
        T("send_message", "Send a text message", ["text", "send a message", "message", "tell"],
          r("to", PERSON), r("body", MSG)),
        T("read_messages", "Read recent messages", ["read my messages", "any new texts", "check my messages"],
          o("from", S("Sender", PEOPLE, ["from {v}"])), o("limit", I("How many", 1, 20, ["the last {v}"], span=(1, 10)))),
    ]),
    ("timers", [
        T("set_timer", "Start a countdown timer", ["set a timer", "start a timer", "time"],
          r("minutes", I("Minutes", 1, 180, ["for {v} minutes", "{v} minutes"], span=(1, 90))), o("label", S("Label", DISHES + ["laundry", "tea", "nap"], ["for the {v}", "called {v}"]))),
        T("set_alarm", "Set an alarm", ["set an alarm", "wake me up", "alarm"],
          r("time", CLOCK), o("days", A("Repeat days", ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"], ["on {v}"], 1, 3)),
          o("label", S("Label", ["gym", "meds", "school run", "flight"], ["for {v}"]))),
        T("cancel_timer", "Cancel the running timer", ["cancel the timer", "stop the timer"]),
    ]),
    ("shopping_list", [
        T("add_items", "Add items to the shopping list", ["add", "put", "I need"],
          r("items", A("Items", ITEMS, ["{v}"], 1, 4)), o("list", E("Which list", ["groceries", "hardware", "pharmacy"], ["to the {v} list", "on my {v} list"]))),
        T("remove_item", "Remove an item", ["remove", "take off", "delete"],
          r("item", S("Item", ITEMS, ["{v}"]))),
        T("show_list", "Show a list", ["show my list", "what's on my shopping list", "read the list"]),
    ]),
    ("online_shopping", [
        T("place_order", "Order products for delivery", ["order", "buy", "purchase", "get me"],
          r("items", AO("Products and quantities", O("A product line", [r("product", S("Product", ITEMS, ["{v}"])),
                                                                          o("quantity", I("Quantity", 1, 50, ["{v} x"], span=(1, 6)))], [""]))),
          o("address", ADDRESS), o("express", B("Express shipping", ["with express shipping", "expedited"], ["standard shipping"]))),
        T("track_package", "Track an order", ["track my package", "where is my order", "track order"],
          r("order_id", S("Order number", ["112-4419", "998-0031", "553-7002", "771-9090"], ["{v}", "number {v}"]))),
        T("return_item", "Start a return", ["return", "send back"],
          r("order_id", S("Order number", ["112-4419", "998-0031", "553-7002"], ["from order {v}"])),
          r("reason", E("Return reason", ["damaged", "wrong size", "not as described", "changed mind"], ["because it's {v}", "reason: {v}"]))),
    ]),
    ("navigation", [
        T("get_directions", "Directions to a place", ["navigate", "directions", "how do I get", "take me"],
          r("destination", S("Destination", PLACES, ["to {v}"])),
          o("mode", E("Travel mode", ["driving", "walking", "cycling", "transit"], ["by {v}", "{v}"])),
          o("avoid", A("Things to avoid", ["tolls", "highways", "ferries"], ["avoiding {v}"], 1, 2))),
        T("find_nearby", "Find places nearby", ["find", "is there", "search for"],
          r("category", E("Place type", ["coffee shop", "pharmacy", "gas station", "ATM", "supermarket", "hospital"], ["a {v} nearby", "the nearest {v}"])),
          o("radius_km", N("Search radius in km", 0.1, 50, ["within {v} km"], span=(1, 20))),
          o("open_now", B("Only open now", ["that's open now", "open right now"], ["even if closed"]))),
        T("share_eta", "Share arrival time", ["share my ETA", "send my arrival time"],
          r("contact", PERSON)),
    ]),
    ("rideshare", [
        T("request_ride", "Request a ride", ["get me a ride", "book a cab", "call a taxi", "order an uber"],
          r("pickup", S("Pickup place", PLACES, ["from {v}"])), r("dropoff", S("Dropoff place", PLACES, ["to {v}"])),
          o("seats", I("Seats", 1, 6, ["for {v}"], span=(1, 4))), o("ride_type", E("Ride type", ["economy", "comfort", "xl", "pool"], ["{v}"]))),
        T("cancel_ride", "Cancel the current ride", ["cancel my ride", "cancel the cab"]),
    ]),
    ("food_delivery", [
        T("order_food", "Order food from a restaurant", ["order", "get me", "I want"],
          r("restaurant", S("Restaurant", RESTAURANTS, ["from {v}"])), r("dishes", A("Dishes", DISHES, ["{v}"], 1, 3)),
          o("tip_percent", I("Tip percent", 0, 50, ["with a {v} percent tip", "tip {v}%"], span=(5, 25))),
          o("contactless", B("Leave at door", ["contactless", "leave it at the door"], ["hand it to me"]))),
        T("search_restaurants", "Find restaurants", ["find restaurants", "search for food", "where can I eat"],
          r("cuisine", E("Cuisine", CUISINES, ["{v}", "serving {v}"])), o("city", CITY),
          o("max_price_level", I("Price level 1-4", 1, 4, ["price level {v}", "at most {v} dollar signs"]))),
    ]),
    ("restaurant_booking", [
        T("book_table", "Reserve a restaurant table", ["book a table", "reserve a table", "get a reservation"],
          r("restaurant", S("Restaurant", RESTAURANTS, ["at {v}"])), r("date", DATE), r("time", TIME), r("party_size", PEOPLE_N),
          o("outdoor", B("Outdoor seating", ["outside", "on the terrace"], ["indoors", "inside"]))),
    ]),
    ("recipes", [
        T("find_recipe", "Find a recipe", ["find a recipe for", "how do I make", "show me a recipe for"],
          r("dish", S("Dish", DISHES, ["{v}"])), o("servings", I("Servings", 1, 20, ["for {v}", "serving {v}"], span=(1, 8))),
          o("diet", E("Diet", ["vegan", "vegetarian", "gluten-free", "keto", "halal"], ["{v}", "that is {v}"])),
          o("max_minutes", I("Max cooking minutes", 5, 300, ["in under {v} minutes"], span=(10, 90)))),
        T("convert_units", "Convert cooking units", ["convert", "how many"],
          r("quantity", N("Amount", 0, 10000, ["{v}"], span=(1, 20))),
          r("from_unit", E("From unit", ["cups", "grams", "ounces", "tablespoons", "ml"], ["{v}"])),
          r("to_unit", E("To unit", ["cups", "grams", "ounces", "tablespoons", "ml"], ["to {v}", "into {v}"]))),
    ]),
    ("fitness", [
        T("log_workout", "Log a workout", ["log", "record", "track"],
          r("activity", E("Activity", EXERCISES, ["{v}", "a {v} session"])), r("minutes", MINUTES),
          o("distance_km", N("Distance in km", 0, 500, ["for {v} km", "covering {v} kilometers"], span=(1, 42))),
          o("avg_heart_rate", I("Average heart rate", 30, 220, ["with heart rate {v}"], span=(90, 180)))),
        T("get_steps", "Step count", ["how many steps", "show my steps", "step count"], o("date", DATE)),
        T("set_goal", "Set a fitness goal", ["set my goal", "change my goal"],
          r("metric", E("Goal metric", ["steps", "calories", "workouts", "minutes"], ["for {v}", "{v}"])),
          r("target", I("Target value", 1, 100000, ["to {v}"], span=(3, 900)))),
    ]),
    ("health", [
        T("add_medication_reminder", "Remind to take a medication", ["remind me to take", "set a reminder for", "add a med reminder for"],
          r("medication", S("Medication", DRUGS, ["{v}", "my {v}"])), r("time", CLOCK),
          o("dose_mg", N("Dose in mg", 0, 5000, ["{v} mg", "a {v} mg dose"], span=(1, 800))),
          o("with_food", B("Take with food", ["with food", "with a meal"], ["on an empty stomach"]))),
        T("log_symptom", "Log a symptom", ["log a symptom", "note that I have", "record"],
          r("symptom", E("Symptom", ["headache", "fever", "cough", "nausea", "back pain"], ["{v}", "a {v}"])),
          o("severity", I("Severity 1-10", 1, 10, ["severity {v}", "at level {v}"]))),
        T("book_doctor", "Book a doctor appointment", ["book a doctor", "make an appointment", "see a doctor"],
          r("specialty", E("Specialty", ["general", "dentist", "dermatology", "cardiology", "pediatrics"], ["{v}", "with a {v}"])),
          r("date", ISO), o("time", CLOCK)),
    ]),
    ("notes", [
        T("create_note", "Create a note", ["make a note", "write down", "note", "jot down"],
          r("text", S("Note text", NOTES, ["\"{v}\"", "{v}", "that says {v}"], maxLength=500)),
          o("folder", E("Folder", ["personal", "work", "ideas", "shopping"], ["in {v}", "under {v}"])),
          o("pinned", B("Pin it", ["and pin it", "pinned"], ["unpinned"])), o("tags", A("Tags", ["todo", "urgent", "home", "family", "draft"], ["tagged {v}"], 1, 2))),
        T("search_notes", "Search notes", ["search my notes", "find the note"],
          r("query", S("Words", NOTES, ["about {v}", "for {v}"]))),
    ]),
    ("reminders", [
        T("create_reminder", "Create a reminder", ["remind me to", "set a reminder to", "don't let me forget to"],
          r("task", S("What to do", TASKS, ["{v}"])), r("date", DATE), o("time", TIME), o("priority", PRIORITY)),
        T("list_reminders", "List reminders", ["what are my reminders", "list reminders", "show reminders"], o("date", DATE)),
    ]),
    ("todo", [
        T("add_task", "Add a task to a project", ["add a task", "create a task", "new task"],
          r("title", S("Task", TASKS, ["to {v}", "\"{v}\""])), o("project", S("Project", PROJECTS, ["in {v}", "for the {v} project"])),
          o("due", ISO), o("priority", PRIORITY), o("assignee", WITH)),
        T("complete_task", "Mark a task done", ["mark done", "complete", "check off"],
          r("title", S("Task", TASKS, ["{v}"]))),
        T("list_tasks", "List tasks", ["list my tasks", "what's left to do", "show tasks"],
          o("project", S("Project", PROJECTS, ["in {v}", "for {v}"])), o("include_done", B("Include finished", ["including finished ones"], ["only open ones"]))),
    ]),
    ("contacts", [
        T("add_contact", "Save a contact", ["add a contact", "save contact", "create a contact for"],
          r("name", S("Full name", PEOPLE, ["{v}", "named {v}"])),
          o("phone", S("Phone number", ["+1 415 555 0134", "555-0199", "+44 20 7946 0958", "+234 803 555 1234"], ["with number {v}", "phone {v}"])),
          o("email", S("Email", EMAILS, ["email {v}", "with email {v}"], pattern="^[^@ ]+@[^@ ]+$")),
          o("address", ADDRESS)),
        T("find_contact", "Look up a contact", ["find", "look up", "what's the number of"],
          r("name", S("Name", PEOPLE, ["{v}"]))),
    ]),
    ("phone", [
        T("call", "Call a contact", ["call", "phone", "ring", "dial"],
          r("contact", S("Who", PEOPLE, ["{v}"])), o("speaker", B("Speakerphone", ["on speaker"], ["not on speaker"])),
          o("video", B("Video call", ["on video", "video"], ["audio only", "voice only"]))),
        T("block_number", "Block a number", ["block", "block the number"],
          r("number", S("Phone number", ["555-0199", "+1 202 555 0147", "800-555-0101"], ["{v}"]))),
    ]),
    ("news", [
        T("get_headlines", "Top news headlines", ["what's the news", "give me the headlines", "read the news"],
          o("topic", E("Topic", ["world", "business", "technology", "sports", "science", "health"], ["about {v}", "in {v}"])),
          o("country", E("Country code", ["US", "GB", "NG", "IN", "JP", "DE", "BR"], ["in {v}", "from {v}"])),
          o("count", I("Headlines", 1, 20, ["top {v}"], span=(1, 10)))),
    ]),
    ("stocks", [
        T("get_stock_price", "Stock price", ["what's the price of", "how is", "check the stock"],
          r("symbol", S("Ticker", STOCKS, ["{v}"], pattern="^[A-Z]{1,5}$"))),
        T("buy_stock", "Buy shares", ["buy", "purchase shares of"],
          r("symbol", S("Ticker", STOCKS, ["{v}"], pattern="^[A-Z]{1,5}$")), r("shares", I("Shares", 1, 10000, ["{v} shares"], span=(1, 100))),
          o("limit_price", N("Limit price", 0, 100000, ["at a limit of {v}", "at {v}"], span=(5, 900)))),
        T("set_price_alert", "Alert when a stock crosses a price", ["alert me when", "set a price alert for"],
          r("symbol", S("Ticker", STOCKS, ["{v}"], pattern="^[A-Z]{1,5}$")), r("price", N("Trigger price", 0, 100000, ["hits {v}", "crosses {v}"], span=(5, 900))),
          o("direction", E("Direction", ["above", "below"], ["going {v}"]))),
    ]),
    ("crypto", [
        T("get_crypto_price", "Cryptocurrency price", ["price of", "how much is", "what's"],
          r("coin", E("Coin", ["bitcoin", "ethereum", "solana", "dogecoin"], ["{v}"])), o("currency", CURRENCY)),
        T("send_crypto", "Send cryptocurrency", ["send", "transfer"],
          r("coin", E("Coin", ["bitcoin", "ethereum", "solana"], ["{v}"])), r("amount", N("Amount", 0, 1000, ["{v}"], span=(1, 9))),
          r("to_wallet", S("Wallet", ["0x71C9", "bc1qar0", "0xA4b2", "5FHneW"], ["to wallet {v}", "to {v}"]))),
    ]),
    ("currency", [
        T("convert_currency", "Convert between currencies", ["convert", "how much is", "exchange"],
          r("amount", AMOUNT), r("from", E("From currency", ["USD", "EUR", "GBP", "JPY", "NGN", "INR"], ["{v}"])),
          r("to", E("To currency", ["USD", "EUR", "GBP", "JPY", "NGN", "INR"], ["to {v}", "in {v}", "into {v}"]))),
    ]),
    ("translation", [
        T("translate", "Translate text", ["translate", "how do you say", "what's"],
          r("text", S("Text", PHRASES_TR, ["\"{v}\"", "{v}"])), r("target_language", E("Language", LANGS, ["in {v}", "into {v}", "to {v}"])),
          o("formal", B("Formal register", ["formally", "in a formal way"], ["casually", "informally"]))),
        T("detect_language", "Detect the language of text", ["what language is", "detect the language of"],
          r("text", S("Text", ["bonjour tout le monde", "guten Morgen", "muchas gracias", "arigato gozaimasu"], ["\"{v}\""]))),
    ]),
    ("sports", [
        T("get_score", "Latest score of a team", ["what's the score", "how did", "did they win"],
          r("team", S("Team", TEAMS, ["{v}", "of the {v} game"])), o("date", DATE)),
        T("get_schedule", "Upcoming games", ["when do", "show the schedule for", "next games of"],
          r("team", S("Team", TEAMS, ["{v}"])), o("count", I("Games", 1, 10, ["next {v}"], span=(1, 5)))),
    ]),
    ("movies", [
        T("find_showtimes", "Cinema showtimes", ["when is", "showtimes for", "find tickets for"],
          r("movie", S("Movie", MOVIES, ["{v}"])), o("city", CITY), o("date", DATE)),
        T("buy_tickets", "Buy movie tickets", ["buy tickets for", "get tickets to", "book seats for"],
          r("movie", S("Movie", MOVIES, ["{v}"])), r("tickets", I("Tickets", 1, 12, ["{v} tickets", "for {v}"], span=(1, 6))),
          o("time", TIME), o("imax", B("IMAX", ["in IMAX"], ["regular screen"]))),
    ]),
    ("tv", [
        T("tv_power", "Turn the TV on or off", ["turn the TV", "switch the TV"], r("on", B("Power on", ["on"], ["off"]))),
        T("change_channel", "Change channel", ["change to channel", "put on channel", "switch to channel"],
          r("channel", I("Channel number", 1, 999, ["{v}"], span=(1, 120)))),
        T("set_volume", "Set TV volume", ["set the volume", "volume"], r("level", I("Volume", 0, 100, ["to {v}", "at {v}"]))),
    ]),
    ("podcasts", [
        T("play_podcast", "Play a podcast", ["play", "put on", "resume"],
          r("show", S("Show", PODCASTS, ["{v}"])), o("latest", B("Latest episode", ["latest episode", "the newest episode"], ["from where I left off"])),
          o("speed", N("Playback speed", 0.5, 3, ["at {v}x", "at {v} speed"], span=(1, 2)))),
        T("subscribe_podcast", "Subscribe to a podcast", ["subscribe to", "follow"], r("show", S("Show", PODCASTS, ["{v}"]))),
    ]),
    ("books", [
        T("search_books", "Search books", ["find the book", "search for", "look up the book"],
          r("title", S("Title", BOOKS, ["{v}"])), o("format", E("Format", ["ebook", "audiobook", "paperback", "hardcover"], ["as an {v}", "in {v}"]))),
        T("add_to_reading_list", "Add to reading list", ["add", "save"], r("title", S("Title", BOOKS, ["{v}"]))),
    ]),
    ("car", [
        T("start_climate", "Precondition the car", ["warm up", "cool down", "start the climate in"],
          r("car", S("Car", CARS, ["{v}"])), o("temperature", N("Cabin temperature", 15, 30, ["to {v} degrees"], span=(16, 28)))),
        T("car_status", "Battery or fuel status", ["how much charge does", "check the fuel in", "status of"],
          r("car", S("Car", CARS, ["{v}"]))),
        T("lock_car", "Lock the car", ["lock", "lock up"], r("car", S("Car", CARS, ["{v}"]))),
    ]),
    ("parking", [
        T("find_parking", "Find parking", ["find parking", "where can I park", "find a parking spot"],
          r("near", S("Place", PLACES, ["near {v}", "close to {v}"])), o("hours", I("Hours", 1, 24, ["for {v} hours"], span=(1, 8))),
          o("covered", B("Covered", ["covered", "in a garage"], ["street parking is fine"]))),
        T("pay_parking", "Pay for parking", ["pay for parking", "pay the meter"],
          r("zone", S("Zone", ["4521", "1180", "7702", "3003"], ["in zone {v}", "zone {v}"], pattern="^[0-9]{4}$")), r("hours", I("Hours", 1, 24, ["for {v} hours"], span=(1, 6)))),
    ]),
    ("public_transit", [
        T("next_departures", "Next departures from a stop", ["when's the next", "next departures from", "when does the next train leave"],
          r("stop", S("Stop", ["Union Station", "Central", "Airport", "Main St", "Harbor"], ["from {v}", "at {v}"])),
          o("mode", E("Mode", ["bus", "train", "tram", "subway", "ferry"], ["{v}"])), o("count", I("How many", 1, 10, ["next {v}"], span=(1, 5)))),
        T("buy_transit_pass", "Buy a transit pass", ["buy a pass", "get a ticket"],
          r("type", E("Pass", ["single", "day", "week", "month"], ["a {v} pass", "{v}"])), o("riders", I("Riders", 1, 6, ["for {v} riders"], span=(1, 4)))),
    ]),
    ("pets", [
        T("log_feeding", "Log a pet feeding", ["log that I fed", "record feeding for", "I just fed"],
          r("pet", S("Pet", PETS, ["{v}"])), o("grams", I("Food grams", 1, 2000, ["{v} grams"], span=(20, 400)))),
        T("book_vet", "Book a vet visit", ["book the vet for", "schedule a vet visit for"],
          r("pet", S("Pet", PETS, ["{v}"])), r("date", ISO), o("reason", E("Reason", ["vaccination", "checkup", "injury", "dental"], ["for a {v}", "for {v}"]))),
        T("find_pet_sitter", "Find a pet sitter", ["find a sitter for", "I need someone to watch"],
          r("pet", S("Pet", PETS, ["{v}"])), r("start", ISO), o("nights", I("Nights", 1, 30, ["for {v} nights"], span=(1, 7)))),
    ]),
    ("plants", [
        T("log_watering", "Log watering a plant", ["I watered", "log watering for", "mark watered"],
          r("plant", S("Plant", PLANTS, ["the {v}", "my {v}"])), o("ml", I("Water in ml", 10, 5000, ["{v} ml"], span=(50, 1000)))),
        T("plant_care_tips", "Care tips for a plant", ["how do I care for", "tips for", "how often to water"],
          r("plant", S("Plant", PLANTS, ["a {v}", "my {v}"])), o("indoor", B("Indoor", ["indoors", "inside"], ["outdoors", "outside"]))),
    ]),
    ("laundry", [
        T("start_washer", "Start the washing machine", ["start the washer", "run a wash", "start the laundry"],
          r("cycle", E("Cycle", ["normal", "delicate", "heavy", "quick", "wool"], ["on {v}", "{v} cycle"])),
          o("temperature_c", I("Water temperature C", 20, 90, ["at {v} degrees"], span=(20, 60))),
          o("extra_rinse", B("Extra rinse", ["with an extra rinse"], ["no extra rinse"]))),
        T("start_dryer", "Start the dryer", ["start the dryer", "dry the clothes"],
          o("minutes", I("Minutes", 10, 180, ["for {v} minutes"], span=(20, 90)))),
    ]),
    ("library", [
        T("renew_loan", "Renew a library loan", ["renew", "extend my loan on"], r("title", S("Title", BOOKS, ["{v}"]))),
        T("place_hold", "Place a hold", ["place a hold on", "reserve"],
          r("title", S("Title", BOOKS, ["{v}"])), o("branch", E("Branch", ["Main", "Eastside", "Harbor", "University"], ["at the {v} branch"]))),
        T("library_hours", "Opening hours of a branch", ["when does", "opening hours of"],
          r("branch", E("Branch", ["Main", "Eastside", "Harbor", "University"], ["the {v} library", "{v} branch"]))),
    ]),
    ("real_estate", [
        T("search_listings", "Search homes", ["find apartments", "search homes", "look for a place"],
          r("city", CITY), o("bedrooms", I("Bedrooms", 0, 10, ["with {v} bedrooms"], span=(1, 4))),
          o("max_rent", N("Max monthly rent", 0, 50000, ["under {v}", "below {v} a month"], span=(500, 4000))),
          o("features", A("Features", ["balcony", "parking", "elevator", "garden", "washer"], ["with {v}"], 1, 2))),
        T("schedule_viewing", "Book a viewing", ["schedule a viewing", "book a tour"],
          r("listing_id", S("Listing", ["L-2231", "L-9910", "L-4407", "L-7788"], ["of {v}", "for {v}"])), r("date", ISO), o("time", CLOCK)),
    ]),
    ("education", [
        T("enroll_course", "Enroll in a course", ["enroll me in", "sign me up for", "register for"],
          r("course", S("Course", COURSES, ["{v}"])), o("level", E("Level", ["beginner", "intermediate", "advanced"], ["at {v} level", "{v}"]))),
        T("get_grades", "Show grades", ["what's my grade in", "show my grades for"], r("course", S("Course", COURSES, ["{v}"]))),
        T("make_flashcards", "Create flashcards", ["make flashcards", "create cards"],
          r("topic", S("Topic", COURSES, ["about {v}", "for {v}"])), o("count", I("Cards", 1, 100, ["{v} cards"], span=(5, 40)))),
    ]),
    ("jobs", [
        T("search_jobs", "Search job postings", ["find jobs", "search for jobs", "look for work"],
          r("title", S("Role", ["data analyst", "nurse", "software engineer", "barista", "teacher"], ["as a {v}", "for {v}"])),
          o("city", CITY), o("remote", B("Remote", ["remote", "work from home"], ["on-site", "in the office"])),
          o("min_salary", I("Minimum salary", 0, 1000000, ["paying at least {v}"], span=(20000, 150000), words=False))),
        T("apply_job", "Apply to a posting", ["apply to", "send my application to"],
          r("job_id", S("Posting", ["J-1029", "J-5531", "J-8870"], ["{v}", "posting {v}"])), o("cover_letter", B("Attach cover letter", ["with my cover letter"], ["without a cover letter"]))),
    ]),
    ("team_chat", [
        T("post_message", "Post in a channel", ["post", "send to", "say in"],
          r("channel", E("Channel", CHANNELS, ["in #{v}", "to #{v}"])), r("text", MSG), o("mention", A("People to mention", PEOPLE[:20], ["mentioning {v}", "and tag {v}"], 1, 2))),
        T("set_status", "Set chat status", ["set my status", "change my status"],
          r("status", E("Status", ["available", "busy", "away", "in a meeting", "on vacation"], ["to {v}", "as {v}"])),
          o("minutes", I("For how long", 5, 1440, ["for {v} minutes"], span=(10, 120)))),
    ]),
    ("video_calls", [
        T("start_meeting", "Start a video meeting", ["start a call", "start a meeting", "video call"],
          r("participants", A("Who", PEOPLE[:24], ["with {v}"], 1, 4)), o("record", B("Record", ["and record it"], ["don't record"])),
          o("topic", S("Topic", TOPICS, ["about {v}"]))),
        T("mute", "Mute or unmute", ["mute me", "unmute me", "toggle mute"], r("muted", B("Muted", ["now"], ["please, unmute"]))),
    ]),
    ("photos", [
        T("search_photos", "Search photos", ["find photos", "show pictures", "search my photos"],
          o("person", S("Who", PEOPLE, ["of {v}"])), o("place", CITY), o("year", I("Year", 1990, 2030, ["from {v}"], words=False, span=(2010, 2026)))),
        T("create_album", "Create an album", ["make an album", "create an album"],
          r("name", S("Album", ["Summer trip", "Wedding", "Baby", "Graduation"], ["called {v}", "named {v}"])),
          o("shared_with", A("Share with", PEOPLE[:20], ["shared with {v}"], 1, 3))),
    ]),
    ("files", [
        T("find_file", "Find a file", ["find my", "where is my", "search for the"],
          r("name", S("File name", DOCS, ["{v}"])), o("type", E("File type", ["pdf", "doc", "image", "spreadsheet"], ["as a {v}", "{v}"]))),
        T("share_file", "Share a file", ["share", "send"],
          r("name", S("File name", DOCS, ["my {v}", "the {v}"])), r("with", EMAIL),
          o("permission", E("Access", ["view", "comment", "edit"], ["with {v} access", "can {v}"]))),
    ]),
    ("travel_planning", [
        T("plan_trip", "Plan an itinerary", ["plan a trip", "make an itinerary", "plan my vacation"],
          r("destination", CITY), r("days", I("Days", 1, 60, ["for {v} days"], span=(2, 14))),
          o("interests", A("Interests", ["museums", "food", "hiking", "nightlife", "beaches", "history"], ["I like {v}", "focused on {v}"], 1, 3)),
          o("budget", E("Budget", ["low", "medium", "luxury"], ["on a {v} budget"]))),
        T("visa_requirements", "Visa rules", ["do I need a visa for", "visa rules for"],
          r("country", S("Destination country", ["Japan", "Brazil", "Kenya", "Canada", "India"], ["{v}"])),
          r("passport", S("Passport country", ["Nigeria", "Germany", "USA", "Mexico"], ["on a {v} passport", "with a {v} passport"]))),
    ]),
    ("car_rental", [
        T("rent_car", "Rent a car", ["rent a car", "book a rental car", "I need a car"],
          r("city", CITY), r("pickup_date", ISO), r("days", I("Days", 1, 90, ["for {v} days"], span=(1, 14))),
          o("car_class", E("Class", ["compact", "midsize", "suv", "van", "luxury"], ["a {v}", "{v}"])),
          o("automatic", B("Automatic", ["automatic"], ["manual", "stick shift"]))),
    ]),
    ("gaming", [
        T("launch_game", "Launch a game", ["launch", "start", "open"], r("game", S("Game", GAMES, ["{v}"]))),
        T("invite_friend", "Invite a friend to play", ["invite", "ask"],
          r("friend", S("Friend", PEOPLE, ["{v}"])), r("game", S("Game", GAMES, ["to play {v}", "to {v}"]))),
        T("set_screen_time", "Limit gaming time", ["limit gaming", "set screen time"],
          r("minutes", I("Minutes per day", 0, 600, ["to {v} minutes"], span=(15, 180)))),
    ]),
    ("donations", [
        T("donate", "Donate to a charity", ["donate", "give", "send a donation of"],
          r("charity", S("Charity", CHARITIES, ["to {v}"])), r("amount", AMOUNT), o("monthly", B("Recurring monthly", ["monthly", "every month"], ["one time", "just once"])),
          o("anonymous", B("Anonymous", ["anonymously"], ["with my name"]))),
    ]),
    ("bills", [
        T("pay_bill", "Pay a bill", ["pay", "pay my"],
          r("biller", E("Biller", ["electricity", "water", "internet", "phone", "gas"], ["{v} bill", "the {v} bill"])),
          r("amount", AMOUNT), o("date", ISO)),
        T("autopay", "Turn autopay on or off", ["set autopay for", "autopay"],
          r("biller", E("Biller", ["electricity", "water", "internet", "phone"], ["{v}", "the {v} bill"])), r("enabled", B("Enabled", ["on"], ["off"]))),
    ]),
    ("budget", [
        T("set_budget", "Set a spending budget", ["set a budget", "limit my spending"],
          r("category", E("Category", ["groceries", "dining", "transport", "entertainment", "shopping"], ["for {v}", "on {v}"])),
          r("limit", N("Monthly limit", 0, 100000, ["to {v}", "of {v}"], span=(50, 2000))), o("currency", CURRENCY)),
        T("spending_report", "Spending summary", ["how much did I spend", "show spending", "spending report"],
          o("category", E("Category", ["groceries", "dining", "transport", "entertainment"], ["on {v}"])),
          o("months", I("Months back", 1, 24, ["over {v} months", "in the last {v} months"], span=(1, 12)))),
    ]),
    ("insurance", [
        T("file_claim", "File an insurance claim", ["file a claim", "start a claim"],
          r("policy", E("Policy", ["car", "home", "travel", "health"], ["on my {v} insurance", "for {v}"])),
          r("date", ISO), o("estimated_cost", N("Estimated cost", 0, 1000000, ["about {v}"], span=(100, 9000)))),
    ]),
    ("home_security", [
        T("arm_alarm", "Arm the alarm", ["arm the alarm", "turn on the security system"],
          r("mode", E("Mode", ["away", "home", "night"], ["in {v} mode", "{v} mode"])), o("delay_seconds", I("Exit delay", 0, 300, ["with a {v} second delay"], span=(10, 90)))),
        T("view_camera", "Show a camera", ["show the camera", "open the camera", "let me see"],
          r("camera", E("Camera", ["front door", "backyard", "garage", "nursery"], ["{v}", "the {v} camera"]))),
    ]),
    ("kitchen_appliances", [
        T("preheat_oven", "Preheat the oven", ["preheat the oven", "heat the oven"],
          r("temperature", I("Temperature", 50, 300, ["to {v} degrees"], span=(150, 250))), o("mode", E("Mode", ["bake", "broil", "convection"], ["on {v}"]))),
        T("brew_coffee", "Brew coffee", ["brew", "make me", "start the coffee maker"],
          r("drink", E("Drink", ["espresso", "latte", "americano", "cappuccino"], ["an {v}", "a {v}"])), o("cups", I("Cups", 1, 8, ["{v} cups"], span=(1, 4))),
          o("strength", E("Strength", ["mild", "medium", "strong"], ["{v}", "extra {v}"]))),
    ]),
    ("sleep", [
        T("log_sleep", "Log sleep", ["log my sleep", "I slept"],
          r("hours", N("Hours slept", 0, 24, ["{v} hours", "for {v} hours"], span=(4, 10))), o("quality", I("Quality 1-5", 1, 5, ["quality {v}", "rated {v}"]))),
        T("play_sleep_sounds", "Play sleep sounds", ["play", "put on"],
          r("sound", E("Sound", ["rain", "ocean", "white noise", "forest"], ["{v} sounds", "some {v}"])), o("minutes", I("Minutes", 5, 480, ["for {v} minutes"], span=(15, 120)))),
    ]),
    ("events_tickets", [
        T("find_events", "Find concerts and events", ["find concerts", "what events are on", "any shows"],
          r("city", CITY), o("date", DATE), o("genre", E("Genre", GENRES, ["{v}"]))),
        T("buy_event_tickets", "Buy event tickets", ["buy tickets for", "get me tickets to"],
          r("artist", S("Artist", ARTISTS, ["{v}"])), r("quantity", I("Tickets", 1, 10, ["{v} tickets", "for {v}"], span=(1, 6))),
          o("section", E("Section", ["floor", "balcony", "vip", "general"], ["in the {v} section", "{v}"]))),
    ]),
    ("language_learning", [
        T("start_lesson", "Start a language lesson", ["start a lesson", "practice", "teach me"],
          r("language", E("Language", LANGS, ["{v}", "in {v}"])), o("minutes", I("Minutes", 5, 120, ["for {v} minutes"], span=(5, 45))),
          o("focus", E("Focus", ["vocabulary", "grammar", "listening", "speaking"], ["on {v}", "focusing on {v}"]))),
        T("word_of_the_day", "Word of the day", ["word of the day", "give me a new word"],
          r("language", E("Language", LANGS, ["in {v}"]))),
    ]),
    ("wallet", [
        T("split_bill", "Split a bill", ["split", "split the bill", "divide"],
          r("total", AMOUNT), r("people", A("Who shares it", PEOPLE[:24], ["with {v}"], 1, 4)),
          o("include_tip", B("Add tip", ["including tip", "plus tip"], ["no tip"]))),
        T("request_payment", "Request money", ["request", "ask for", "charge"],
          r("from", S("Who pays", PEOPLE, ["from {v}"])), r("amount", AMOUNT), o("reason", S("Reason", ["pizza", "concert tickets", "rent", "gas"], ["for {v}"]))),
    ]),
]

# Never in the pretrain split: zero-shot generalisation and the fine-tune demo.
HELDOUT = ["pets", "plants", "laundry", "library", "parking", "real_estate", "donations", "kitchen_appliances"]
