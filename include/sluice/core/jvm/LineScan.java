package sluice.jvm;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.math.BigDecimal;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.api.java.UDF2;
import scala.collection.Seq;

/**
 * The common landing line, read in one pass: a flat JSON object whose values are strings, whole numbers,
 * plain decimals (15.25), booleans or nulls. For each declared field (the names, in order) it gives two
 * elements, its JSON type as Spark's schema_of_variant names it (STRING, BIGINT, DECIMAL(p,s), BOOLEAN, VOID;
 * null when the key is absent) and its text (the string itself, the number's canonical digits, true or false;
 * null for a JSON null).
 *
 * It answers only where that answer is the one sluice's VARIANT parse gives (sluice.ingest.parsing), and
 * returns null for every other line: anything that is not one object, a nested value, an exponent, a whole
 * number beyond 18 digits or a fraction beyond 38, a key given twice, a \\u escape, or whatever Jackson
 * refuses. Those lines take the VARIANT path, which decides their types and quarantine reasons as before.
 * Why: typing each field out of a VARIANT cost 5.5 s per million lines on two cores; this costs about 1 s
 * (bench/README). Fractions are common (a temperature, a price): without them a reading of 15.5 took the
 * VARIANT path for the whole line.
 */
public final class LineScan implements UDF2<String, Seq<String>, String[]> {
    private static final long serialVersionUID = 1L;
    private static final JsonFactory FACTORY = new JsonFactory();
    private static final int MAX_DIGITS = 18; // every 18-digit integer fits a long

    private transient Seq<String> lastNames;
    private transient Map<String, Integer> index;

    @Override
    public String[] call(String raw, Seq<String> names) {
        if (raw == null || raw.indexOf("\\u") >= 0 || !opensObject(raw)) {
            return null;
        }
        Map<String, Integer> fields = indexOf(names);
        String[] out = new String[2 * fields.size()];
        Set<String> seen = new HashSet<>();
        try (JsonParser p = FACTORY.createParser(raw)) {
            p.nextToken(); // START_OBJECT, checked by opensObject
            JsonToken token;
            while ((token = p.nextToken()) == JsonToken.FIELD_NAME) {
                String key = p.currentName();
                if (!seen.add(key)) {
                    return null;
                }
                JsonToken value = p.nextToken();
                String type;
                String text;
                switch (value) {
                    case VALUE_STRING:
                        type = "STRING";
                        text = p.getText();
                        break;
                    case VALUE_NUMBER_INT:
                        String digits = p.getText();
                        if (digits.length() - (digits.charAt(0) == '-' ? 1 : 0) > MAX_DIGITS) {
                            return null;
                        }
                        type = "BIGINT";
                        text = Long.toString(Long.parseLong(digits)); // -0 is 0, as in a VARIANT
                        break;
                    case VALUE_NUMBER_FLOAT:
                        BigDecimal decimal = decimal(p.getText());
                        if (decimal == null) {
                            return null;
                        }
                        type = decimalType(decimal);
                        text = decimal.toPlainString();
                        break;
                    case VALUE_TRUE:
                    case VALUE_FALSE:
                        type = "BOOLEAN";
                        text = p.getText();
                        break;
                    case VALUE_NULL:
                        type = "VOID";
                        text = null;
                        break;
                    default: // an object or an array
                        return null;
                }
                Integer at = fields.get(key);
                if (at != null) {
                    out[2 * at] = type;
                    out[2 * at + 1] = text;
                }
            }
            if (token != JsonToken.END_OBJECT || p.nextToken() != null) {
                return null; // not one object, or something after it
            }
        } catch (Exception e) {
            return null; // Jackson refused it: the VARIANT path says why
        }
        return out;
    }

    /**
     * A fraction as the VARIANT holds it, or null where the VARIANT holds a double (its text has an exponent,
     * or more than 38 digits or decimal places: Spark's parse_json keeps a decimal only then) and the line is
     * left to that path. Trailing zeros are dropped, as schema_of_variant and to_json see the value (15.50 is
     * DECIMAL(3,1) 15.5, 100.0 is DECIMAL(3,0) 100, -0.0 is 0).
     */
    private static BigDecimal decimal(String text) {
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c != '-' && c != '.' && (c < '0' || c > '9')) {
                return null;
            }
        }
        BigDecimal exact = new BigDecimal(text);
        if (exact.scale() > 38 || exact.precision() > 38) {
            return null;
        }
        BigDecimal stripped = exact.stripTrailingZeros();
        // Spark's Decimal holds no negative scale: 1E+2 is 100, with a scale of 0.
        return stripped.scale() < 0 ? stripped.setScale(0) : stripped;
    }

    /** DECIMAL(p,s) as Spark's Decimal counts them: a precision never below the scale (0.05 is DECIMAL(2,2)). */
    private static String decimalType(BigDecimal decimal) {
        int scale = decimal.scale();
        return "DECIMAL(" + Math.max(decimal.precision(), scale) + "," + scale + ")";
    }

    /** Whether the line is JSON whitespace, then '{': Jackson would skip other characters Spark does not. */
    private static boolean opensObject(String raw) {
        for (int i = 0; i < raw.length(); i++) {
            char c = raw.charAt(i);
            if (c == '{') {
                return true;
            }
            if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
                return false;
            }
        }
        return false;
    }

    private Map<String, Integer> indexOf(Seq<String> names) {
        if (names != lastNames && (lastNames == null || !names.equals(lastNames))) {
            Map<String, Integer> built = new HashMap<>();
            for (int i = 0; i < names.size(); i++) {
                built.put(names.apply(i), i);
            }
            index = built;
            lastNames = names;
        }
        return index;
    }
}
